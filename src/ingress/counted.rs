//! A stream that adds the bytes read from and written to it to a sandbox's
//! counter as they pass, so a long websocket or raw TCP stream shows in
//! the sandbox's usage while it lasts, however it ends (a reset, a cut).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub struct Counted<S> {
    inner: S,
    sandbox_bytes: Arc<AtomicU64>,
    /// Read from `inner` (the app's bytes, going out).
    pub read: u64,
    /// Written to `inner` (the client's bytes, coming in).
    pub written: u64,
}

impl<S> Counted<S> {
    pub fn new(inner: S, sandbox_bytes: Arc<AtomicU64>) -> Self {
        Counted {
            inner,
            sandbox_bytes,
            read: 0,
            written: 0,
        }
    }

    fn count(&mut self, n: usize, read: bool) {
        let n = n as u64;
        self.sandbox_bytes.fetch_add(n, Ordering::Relaxed);
        if read {
            self.read += n;
        } else {
            self.written += n;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let n = buf.filled().len().saturating_sub(before);
            this.count(n, true);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = polled {
            this.count(n, false);
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn both_ways_are_counted_as_they_pass() {
        let (near, mut far) = tokio::io::duplex(64);
        let total = Arc::new(AtomicU64::new(0));
        let mut counted = Counted::new(near, Arc::clone(&total));
        counted.write_all(b"hello").await.expect("write");
        far.write_all(b"hi").await.expect("far write");
        let mut got = [0u8; 2];
        counted.read_exact(&mut got).await.expect("read");
        assert_eq!((counted.written, counted.read), (5, 2));
        assert_eq!(total.load(Ordering::Relaxed), 7);
    }
}
