//! A response body that holds a create's [`crate::sandbox::Answered`]
//! guard until the connection has taken the whole body, so work that waits
//! for the answer (the claimed sandbox's watch, the TTL's wake-up, the
//! pool's refill) does not compete with sending it.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};

/// `inner`, and `guard` dropped at its end (or with it, unsent).
pub struct AnsweredBody<G> {
    inner: Body,
    guard: Option<G>,
}

impl<G: Unpin> HttpBody for AnsweredBody<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) {
            this.guard = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `response`, its body holding `guard` until it is sent (or dropped
/// unsent).
pub fn holding<G: Send + Unpin + 'static>(response: impl IntoResponse, guard: G) -> Response {
    response.into_response().map(|inner| {
        Body::new(AnsweredBody {
            inner,
            guard: Some(guard),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[tokio::test]
    async fn the_guard_goes_at_the_bodys_end_and_its_length_stays_known() {
        let dropped = Arc::new(AtomicBool::new(false));
        let answer = (axum::http::StatusCode::CREATED, "{\"id\":\"sb-1\"}");
        let mut body = holding(answer, Flag(Arc::clone(&dropped))).into_body();
        assert_eq!(body.size_hint().exact(), Some(13), "a Content-Length");
        let data = body.frame().await.expect("a frame").expect("data");
        assert_eq!(
            data.into_data().ok().as_deref(),
            Some(&b"{\"id\":\"sb-1\"}"[..])
        );
        assert!(
            !dropped.load(Ordering::Acquire),
            "held while the body is sent"
        );
        assert!(body.frame().await.is_none(), "the end");
        assert!(
            dropped.load(Ordering::Acquire),
            "gone at the end, the body still here"
        );

        let unsent = Arc::new(AtomicBool::new(false));
        drop(holding("x", Flag(Arc::clone(&unsent))));
        assert!(
            unsent.load(Ordering::Acquire),
            "gone with a body never sent"
        );
    }
}
