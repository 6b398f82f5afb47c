//! A process's output as the supervisor keeps it: stdout and stderr chunks in
//! the order they arrived, bounded in bytes. When the bound is passed the
//! oldest chunks go and their bytes are counted as dropped, so a process that
//! prints faster than anyone reads never stalls and never grows memory.
//! Readers resume from a per-stream byte offset.

use std::collections::VecDeque;

use sandbox_proto::Stream;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputItem {
    Data {
        stream: Stream,
        offset: u64,
        data: Vec<u8>,
    },
    /// `bytes` of `stream` before the next data were lost to the bound.
    Dropped { stream: Stream, bytes: u64 },
}

struct Chunk {
    stream: Stream,
    offset: u64,
    data: Vec<u8>,
}

fn index(stream: Stream) -> usize {
    match stream {
        Stream::Stdout => 0,
        Stream::Stderr => 1,
    }
}

pub struct OutputLog {
    chunks: VecDeque<Chunk>,
    held: usize,
    capacity: usize,
    /// Offset the next byte of each stream will get.
    next: [u64; 2],
    /// Offset of the oldest byte of each stream still held.
    first_held: [u64; 2],
    dropped: [u64; 2],
}

impl OutputLog {
    pub fn new(capacity: usize) -> Self {
        Self {
            chunks: VecDeque::new(),
            held: 0,
            capacity,
            next: [0; 2],
            first_held: [0; 2],
            dropped: [0; 2],
        }
    }

    pub fn append(&mut self, stream: Stream, data: Vec<u8>) {
        if data.is_empty() {
            return;
        }
        let i = index(stream);
        let len = data.len();
        self.chunks.push_back(Chunk {
            stream,
            offset: self.next[i],
            data,
        });
        self.next[i] += len as u64;
        self.held += len;
        while self.held > self.capacity {
            let Some(old) = self.chunks.pop_front() else {
                break;
            };
            let j = index(old.stream);
            self.held -= old.data.len();
            self.dropped[j] += old.data.len() as u64;
            self.first_held[j] = old.offset + old.data.len() as u64;
        }
    }

    /// Total bytes dropped, both streams.
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped[0] + self.dropped[1]
    }

    /// Everything after `offsets` (stdout, stderr), in arrival order, and the
    /// offsets to resume from next time.
    pub fn read_from(&self, offsets: [u64; 2]) -> (Vec<OutputItem>, [u64; 2]) {
        let mut at = offsets;
        let mut items = Vec::new();
        for stream in [Stream::Stdout, Stream::Stderr] {
            let i = index(stream);
            if at[i] < self.first_held[i] {
                items.push(OutputItem::Dropped {
                    stream,
                    bytes: self.first_held[i] - at[i],
                });
                at[i] = self.first_held[i];
            }
        }
        for chunk in &self.chunks {
            let i = index(chunk.stream);
            let end = chunk.offset + chunk.data.len() as u64;
            if end <= at[i] {
                continue;
            }
            let skip = at[i].saturating_sub(chunk.offset) as usize;
            items.push(OutputItem::Data {
                stream: chunk.stream,
                offset: chunk.offset + skip as u64,
                data: chunk.data[skip..].to_vec(),
            });
            at[i] = end;
        }
        (items, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(stream: Stream, offset: u64, d: &[u8]) -> OutputItem {
        OutputItem::Data {
            stream,
            offset,
            data: d.to_vec(),
        }
    }

    #[test]
    fn keeps_interleaving_and_resumes_mid_chunk() {
        let mut log = OutputLog::new(1024);
        log.append(Stream::Stdout, b"abc".to_vec());
        log.append(Stream::Stderr, b"E".to_vec());
        log.append(Stream::Stdout, b"de".to_vec());
        let (items, at) = log.read_from([0, 0]);
        assert_eq!(
            items,
            vec![
                data(Stream::Stdout, 0, b"abc"),
                data(Stream::Stderr, 0, b"E"),
                data(Stream::Stdout, 3, b"de"),
            ]
        );
        assert_eq!(at, [5, 1]);
        let (items, _) = log.read_from([1, 1]);
        assert_eq!(
            items,
            vec![
                data(Stream::Stdout, 1, b"bc"),
                data(Stream::Stdout, 3, b"de")
            ]
        );
    }

    #[test]
    fn overflow_drops_oldest_and_reports_the_gap() {
        let mut log = OutputLog::new(4);
        log.append(Stream::Stdout, b"aaa".to_vec());
        log.append(Stream::Stdout, b"bbb".to_vec());
        assert_eq!(log.dropped_bytes(), 3);
        let (items, at) = log.read_from([0, 0]);
        assert_eq!(
            items,
            vec![
                OutputItem::Dropped {
                    stream: Stream::Stdout,
                    bytes: 3
                },
                data(Stream::Stdout, 3, b"bbb"),
            ]
        );
        assert_eq!(at, [6, 0]);
    }
}
