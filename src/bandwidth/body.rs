//! The body wrapper that paces a body's bytes by its key's budget.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::shared::Shared;
use crate::util::now_or_later::NowOrLater;
use crate::{decision::Decision, decision::Source, key::Key};

pin_project_lite::pin_project! {
    /// A body through a [`BandwidthLimitLayer`](super::BandwidthLimitLayer):
    /// its data frames come out no faster than its key's budget allows.
    ///
    /// When the budget is spent the body returns `Pending` and wakes on a
    /// timer when enough bytes are back; it is never cut. A frame larger
    /// than the budget lets out at once is split (without copying) and let
    /// out in pieces. Only the frame being let out is held: a slow reader
    /// slows the inner body, as without the layer. Trailers and other
    /// frames pass at once. A request or response the limit does not apply
    /// to (no key, under [`OnMissingKey::Skip`](crate::OnMissingKey::Skip))
    /// passes as is. The timer is Tokio's: a shaped body is polled on a
    /// Tokio runtime with time enabled, as axum's and tonic's servers are.
    pub struct ShapedBody<B> {
        #[pin]
        inner: B,
        shaper: Option<Box<Shaper>>,
    }
}

/// One body's place in its key's budget.
struct Shaper {
    shared: Arc<Shared>,
    key: Key,
    /// The frame being let out, what is left of it.
    held: Option<Bytes>,
    piece: NonZeroU32,
    /// Bytes paid for and not yet let out (under a piece and a unit), and
    /// where they were spent.
    credit: u32,
    source: Source,
    sleep: Option<Pin<Box<Sleep>>>,
    /// A decision from Redis, and the units it is for.
    asking: Option<(BoxFuture<'static, (Decision, Source)>, u32)>,
}

impl<B> ShapedBody<B> {
    pub(crate) fn new(inner: B, shaped: Option<(Arc<Shared>, Key)>) -> Self {
        let shaper = shaped.map(|(shared, key)| {
            Box::new(Shaper {
                piece: shared.piece,
                shared,
                key,
                held: None,
                credit: 0,
                source: Source::Local,
                sleep: None,
                asking: None,
            })
        });
        Self { inner, shaper }
    }

    /// Whether this body is paced (a key was found for it).
    pub fn is_shaped(&self) -> bool {
        self.shaper.is_some()
    }
}

impl Shaper {
    /// Lets out the next piece of the held frame, or `Pending` until the
    /// budget has it. `rest`: the most bytes the inner body has left.
    fn poll_piece(&mut self, cx: &mut Context<'_>, rest: u64) -> Poll<Option<Bytes>> {
        loop {
            let len = match &self.held {
                Some(h) if !h.is_empty() => h.len(),
                _ => {
                    self.held = None;
                    return Poll::Ready(None);
                }
            };
            let want = self.ask_size(len as u64, rest);
            let credit = self.credit as usize;
            if credit >= len.min(want as usize)
                && let Some(held) = &mut self.held
            {
                let out = held.split_to(len.min(credit));
                self.credit -= out.len() as u32;
                if held.is_empty() {
                    self.held = None;
                }
                return Poll::Ready(Some(out));
            }
            if let Some(sleep) = &mut self.sleep {
                ready!(sleep.as_mut().poll(cx));
            }
            let ((d, source), units) = match &mut self.asking {
                Some((ask, units)) => {
                    let decided = (ready!(ask.as_mut().poll(cx)), *units);
                    self.asking = None;
                    decided
                }
                None => {
                    // Whole units for what the credit lacks; the rest of the
                    // last one stays as credit.
                    let unit = self.shared.unit;
                    let units = want.saturating_sub(self.credit).div_ceil(unit);
                    let units = NonZeroU32::new(units).unwrap_or(NonZeroU32::MIN);
                    match self.shared.meter.take(&self.key, units) {
                        NowOrLater::Now(d) => (d, units.get()),
                        NowOrLater::Later(ask) => {
                            self.asking = Some((ask, units.get()));
                            continue;
                        }
                    }
                }
            };
            if d.is_allowed() {
                let bytes = units.saturating_mul(self.shared.unit);
                (self.credit, self.source) = (self.credit.saturating_add(bytes), source);
                continue;
            }
            let wait = match d.retry_after() {
                Some(w) => w,
                // Never fits: a smaller piece may (e.g. a lease's burst).
                None => {
                    let half = (self.piece.get() / 2).max(self.shared.unit);
                    let smaller = half < self.piece.get();
                    self.piece = NonZeroU32::new(half).unwrap_or(NonZeroU32::MIN);
                    // A unit that never fits: no busy loop while it lasts.
                    Duration::from_millis(if smaller { 1 } else { 1000 })
                }
            };
            self.wait(wait.max(Duration::from_millis(1)));
        }
    }

    /// The bytes to take at once: the frame's, up to a piece; for a budget
    /// leased from Redis a whole piece when the body has that much left,
    /// so a key at its limit asks Redis once a piece, not once a frame.
    fn ask_size(&self, held: u64, rest: u64) -> u32 {
        let piece = u64::from(self.piece.get());
        let mut n = held.min(piece);
        if self.shared.global {
            n = n.max(held.saturating_add(rest).min(piece));
        }
        // At most a piece, a `u32`.
        n as u32
    }

    fn wait(&mut self, wait: Duration) {
        let at = crate::util::instant::after(Instant::now(), wait);
        match &mut self.sleep {
            Some(s) => s.as_mut().reset(at),
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }
}

impl Drop for Shaper {
    fn drop(&mut self) {
        // Paid for and never sent: the key's, not lost with the body.
        let units = self.credit / self.shared.unit;
        if units > 0 {
            self.shared.meter.give_back(&self.key, units, self.source);
        }
    }
}

impl<B> Body for ShapedBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        let Some(shaper) = this.shaper.as_mut() else {
            return this.inner.poll_frame(cx);
        };
        loop {
            if shaper.held.is_some() {
                let rest = this.inner.size_hint().upper().unwrap_or(u64::MAX);
                if let Some(piece) = ready!(shaper.poll_piece(cx, rest)) {
                    return Poll::Ready(Some(Ok(Frame::data(piece))));
                }
                continue;
            }
            let frame = match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                other => return Poll::Ready(other),
            };
            match frame.into_data() {
                Ok(data) if !data.is_empty() => shaper.held = Some(data),
                Ok(empty) => return Poll::Ready(Some(Ok(Frame::data(empty)))),
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let held = self.shaper.as_ref().is_some_and(|s| s.held.is_some());
        !held && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        let held = self
            .shaper
            .as_ref()
            .and_then(|s| s.held.as_ref())
            .map_or(0, |h| h.len() as u64);
        if held > 0 {
            // Upper first: `set_lower` above the old upper panics.
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper.saturating_add(held));
            }
            hint.set_lower(hint.lower().saturating_add(held));
        }
        hint
    }
}

impl<B> std::fmt::Debug for ShapedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ShapedBody");
        if let Some(s) = &self.shaper {
            d.field("limit", &s.shared.name)
                .field("held", &s.held.as_ref().map_or(0, Bytes::len));
        }
        d.finish_non_exhaustive()
    }
}
