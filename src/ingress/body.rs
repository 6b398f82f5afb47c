//! Bodies passed through the ingress: streamed frame by frame (nothing is
//! buffered, so server-sent events arrive as written), counted into the
//! sandbox's bytes, and cut off at once when the port is closed (unexpose,
//! the sandbox's teardown). The response body also holds the request's
//! link and writes its log line when it ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame, SizeHint};
use tokio_util::sync::WaitForCancellationFutureOwned;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type IngressBody = BoxBody<Bytes, BoxError>;

/// What ends with the body: the link it holds and its log line.
pub trait OnEnd: Send + Sync + 'static {
    fn ended(&mut self, bytes: u64, cut: bool);
}

pub struct Metered<B> {
    inner: B,
    counted: u64,
    sandbox_bytes: Arc<AtomicU64>,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    cut: bool,
    on_end: Option<Box<dyn OnEnd + Send>>,
}

impl<B> Metered<B> {
    pub fn new(
        inner: B,
        sandbox_bytes: Arc<AtomicU64>,
        closed: tokio_util::sync::CancellationToken,
        on_end: Option<Box<dyn OnEnd + Send>>,
    ) -> Self {
        Metered {
            inner,
            counted: 0,
            sandbox_bytes,
            closed: Box::pin(closed.cancelled_owned()),
            cut: false,
            on_end,
        }
    }
}

impl<B> Drop for Metered<B> {
    fn drop(&mut self) {
        if let Some(mut on_end) = self.on_end.take() {
            on_end.ended(self.counted, self.cut);
        }
    }
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.cut || this.closed.as_mut().poll(cx).is_ready() {
            this.cut = true;
            return Poll::Ready(Some(Err("the sandbox's port was closed".into())));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    this.counted += n;
                    this.sandbox_bytes.fetch_add(n, Ordering::Relaxed);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
