//! grpcio stubs from `xds-protos`: a client this project did not write.
