//! Zero-copy forwarding from one TCP socket to another through a pipe
//! (splice(2)), for the bytes the proxy does not need to look at. Copying
//! through user space costs the proxy two copies per byte; on a small host
//! that CPU comes out of the sandboxes' own throughput.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes moved per splice: the pipe is sized to hold this much.
const PIPE_BYTES: usize = 1 << 20;

/// A pipe for [`forward`]; one per direction of a connection.
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    pub fn new() -> io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        // A larger pipe means fewer wake-ups; the default (64 KiB) still
        // works if the host's pipe-max-size refuses it.
        let capacity = fcntl(write.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_BYTES as i32))
            .map(|n| n as usize)
            .unwrap_or(64 * 1024);
        Ok(Pipe {
            read,
            write,
            capacity,
        })
    }
}

/// Moves bytes from `from` to `to` until `from` reaches end of stream;
/// returns how many. Not for capped connections: one step can move more
/// than asked (TCP splices whole received buffers), so a cap could not be
/// held to the byte.
pub async fn forward(from: &TcpStream, to: &TcpStream, pipe: &Pipe) -> io::Result<u64> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    let mut total = 0u64;
    loop {
        // The pipe is empty here: fill it from the socket.
        let filled = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                splice(
                    from.as_fd(),
                    None,
                    pipe.write.as_fd(),
                    None,
                    pipe.capacity,
                    flags,
                )
                .map_err(io::Error::from)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if filled == 0 {
            return Ok(total);
        }
        let mut left = filled;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_fd(), None, to.as_fd(), None, left, flags)
                    .map_err(io::Error::from)
            }) {
                Ok(n) => left -= n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        total += filled as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn forwards_every_byte_in_order_then_the_end() {
        let (mut source, from) = pair().await;
        let (to, mut sink) = pair().await;
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            source.write_all(&sent).await.unwrap();
            source.shutdown().await.unwrap();
        });
        let pipe = Pipe::new().unwrap();
        let forwarded = tokio::spawn(async move {
            let n = forward(&from, &to, &pipe).await.unwrap();
            drop(to);
            n
        });
        let mut got = Vec::new();
        sink.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        let n = forwarded.await.unwrap();
        assert_eq!(n, data.len() as u64);
        assert!(got == data, "bytes differ");
    }
}
