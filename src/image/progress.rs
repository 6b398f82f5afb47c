//! What a pull or a build reports while it runs, for `POST /v1/images`'s
//! NDJSON stream: bytes of each layer as they arrive, and build log
//! output. A follower that goes away never slows or stops the work.

use std::pin::Pin;
use std::task::{Context, Poll};

use serde::Serialize;
use tokio::io::AsyncWrite;

/// One report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Progress {
    /// `bytes` of layer `digest`'s `total` compressed bytes are here.
    Layer {
        digest: String,
        bytes: u64,
        total: u64,
    },
    /// Build log output (lossy UTF-8).
    Log { data: String },
}

/// Where reports go.
pub type ProgressSink = tokio::sync::mpsc::UnboundedSender<Progress>;

/// Sends to `sink`, if any; a closed one is ignored.
pub fn report(sink: Option<&ProgressSink>, progress: Progress) {
    if let Some(sink) = sink {
        let _ = sink.send(progress);
    }
}

/// Bytes between two layer reports.
const REPORT_EVERY: u64 = 1 << 20;

/// A writer that reports the bytes written through it as a layer's.
pub struct CountingWriter<W> {
    inner: W,
    sink: Option<ProgressSink>,
    digest: String,
    total: u64,
    written: u64,
    reported: u64,
}

impl<W> CountingWriter<W> {
    pub fn new(inner: W, sink: Option<ProgressSink>, digest: &str, total: u64) -> Self {
        CountingWriter {
            inner,
            sink,
            digest: digest.to_string(),
            total,
            written: 0,
            reported: 0,
        }
    }

    /// Reports the bytes not reported yet (the writer's user calls it at
    /// the end: not every writer sees a shutdown).
    pub fn finish(&mut self) {
        if self.written != self.reported {
            self.report();
        }
    }

    fn report(&mut self) {
        self.reported = self.written;
        report(
            self.sink.as_ref(),
            Progress::Layer {
                digest: self.digest.clone(),
                bytes: self.written,
                total: self.total,
            },
        );
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CountingWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.written += n as u64;
            if self.written - self.reported >= REPORT_EVERY {
                self.report();
            }
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        if polled.is_ready() {
            self.finish();
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn layer_bytes_are_reported_every_mebibyte_and_at_the_end() {
        let (sink, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let total = (REPORT_EVERY * 2 + 5) as usize;
        let mut writer = CountingWriter::new(Vec::new(), Some(sink), "sha256:a", total as u64);
        for chunk in vec![0u8; total].chunks(64 << 10) {
            writer.write_all(chunk).await.unwrap();
        }
        writer.shutdown().await.unwrap();
        drop(writer);
        let mut seen = Vec::new();
        while let Some(Progress::Layer { bytes, .. }) = reports.recv().await {
            seen.push(bytes);
        }
        assert_eq!(seen, [REPORT_EVERY, REPORT_EVERY * 2, total as u64]);
    }
}
