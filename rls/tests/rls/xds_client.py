"""Protocol cases against a running rate-limit service, with Envoy's own
grpcio stubs (the PyPI package xds-protos): a client this project did not
write. Usage: python xds_client.py HOST:PORT. Exits non-zero on the first
case that fails, naming it."""

import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(sys.argv[1]))


def descriptor(*entries, hits=None, limit=None):
    d = common.RateLimitDescriptor(
        entries=[common.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    if limit is not None:
        d.limit.CopyFrom(limit)
    return d


def ask(*descriptors, domain="edge", hits_addend=0):
    return stub.ShouldRateLimit(
        rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits_addend)
    )


def codes(response):
    return [s.code for s in response.statuses]


def check(name, got, want):
    if got != want:
        print(f"FAIL {name}: got {got!r}, want {want!r}")
        sys.exit(1)
    print(f"ok   {name}")


# hits_addend per descriptor: 0 checks without counting, above 1 spends that many.
r = ask(descriptor(("user", "py-hits"), hits=0))
check("hits_addend 0 checks", (codes(r), r.statuses[0].limit_remaining), ([OK], 3))
r = ask(descriptor(("user", "py-hits"), hits=2))
check("hits_addend 2 spends two", r.statuses[0].limit_remaining, 1)
r = ask(descriptor(("user", "py-hits"), hits=0))
check("a check after spending", r.statuses[0].limit_remaining, 1)
r = ask(descriptor(("user", "py-hits"), hits=2))
check("two more than is left", codes(r), [OVER])
r = ask(descriptor(("user", "py-request-hits")), hits_addend=3)
check("the request's hits_addend", r.statuses[0].limit_remaining, 0)

# A limit override: its own quota, its own counter.
override = common.RateLimitDescriptor.RateLimitOverride(requests_per_unit=1, unit=3)
r = ask(descriptor(("user", "py-override"), limit=override))
check(
    "override shown",
    (codes(r), r.statuses[0].current_limit.requests_per_unit, r.statuses[0].current_limit.unit),
    ([OK], 1, 3),
)
check("override counted", codes(ask(descriptor(("user", "py-override"), limit=override))), [OVER])
r = ask(descriptor(("user", "py-override")))
check("the configured quota untouched", r.statuses[0].limit_remaining, 2)

# The order of statuses, and the overall code.
r = ask(descriptor(("path", "/login")), descriptor(("nothing", "here")), descriptor(("user", "py-order")))
check("statuses in request order", (codes(r), r.statuses[1].HasField("current_limit")), ([OK, OK, OK], False))
ask(descriptor(("path", "/login")))
r = ask(descriptor(("path", "/login")), descriptor(("user", "py-order")))
check("one over is overall over", (codes(r), r.overall_code), ([OVER, OK], OVER))
check("the limit's name", r.statuses[0].current_limit.name, "login")

# Nested and wildcard matches from an envoyproxy/ratelimit configuration.
free = lambda: ask(descriptor(("tenant", "py"), ("plan", "free")))
check("nested exact 1", codes(free()), [OK])
check("nested exact 2", codes(free()), [OK])
check("nested exact over", codes(free()), [OVER])
for i in range(4):
    check(f"nested key alone {i + 1}", codes(ask(descriptor(("tenant", "py"), ("plan", "pro")))), [OK])
check("nested key alone over", codes(ask(descriptor(("tenant", "py"), ("plan", "pro")))), [OVER])
check("wildcard", codes(ask(descriptor(("path", "/export/1")))), [OK])
check("wildcard counted per value", codes(ask(descriptor(("path", "/export/1")))), [OVER])
check("wildcard, another value", codes(ask(descriptor(("path", "/export/2")))), [OK])

# Headers and body of a refusal.
r = ask(descriptor(("path", "/export/1")))
headers = {h.key: h.value for h in r.response_headers_to_add}
check("retry-after on a refusal", "retry-after" in headers, True)
check("ratelimit-policy on a refusal", headers.get("ratelimit-policy", "").startswith('"edge.path_/export*"'), True)
check("problem body", b'"status":429' in r.raw_body, True)

# Malformed requests, each with a clear status.
def status_of(call):
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return None, None


code, details = status_of(lambda: ask(descriptor(("user", "x")), domain=""))
check("empty domain", (code, "domain" in details), (grpc.StatusCode.INVALID_ARGUMENT, True))
code, details = status_of(lambda: ask())
check("no descriptors", (code, "no descriptors" in details), (grpc.StatusCode.INVALID_ARGUMENT, True))
# A value a client controls is counted, whatever its length: 3 a minute.
huge = [codes(ask(descriptor(("user", "x" * 100_000)))) for _ in range(4)]
check("a huge value is counted", huge, [[OK], [OK], [OK], [OVER]])
print("all protocol cases passed")
