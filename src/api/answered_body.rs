//! A response body that holds a create's [`Answered`] guard until the
//! connection has taken the whole body, so work that waits for the answer
//! (the claimed sandbox's watch) does not compete with sending it.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};

use crate::sandbox::Answered;

pub struct AnsweredBody {
    inner: Body,
    answered: Option<Answered>,
}

impl HttpBody for AnsweredBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) {
            this.answered = None;
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

/// `response`, its body holding `answered` until it is sent (or dropped
/// unsent).
pub fn holding(response: impl IntoResponse, answered: Answered) -> Response {
    response.into_response().map(|inner| {
        Body::new(AnsweredBody {
            inner,
            answered: Some(answered),
        })
    })
}
