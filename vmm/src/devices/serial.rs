//! The serial console: a 16550 UART (vm-superio) on COM1 (port 0x3f8, IRQ 4
//! through an irqfd), whose output goes to a size-capped sink. The sink also
//! notes when the first full line arrived, the boot-time figure the benchmarks
//! use. The UART's register state is serialisable for snapshots.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// COM1's first port.
pub const COM1_PORT: u64 = 0x3f8;
/// COM1's ports: 0x3f8-0x3ff.
pub const COM1_LEN: u64 = 8;
/// COM1's interrupt line (ISA IRQ 4; GSI 4 on the in-kernel PIC/IOAPIC).
pub const COM1_GSI: u32 = 4;
/// Default cap on serial output kept per VM.
pub const DEFAULT_SERIAL_CAP_BYTES: u64 = 1 << 20;

/// Errors building the serial device.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    /// The interrupt eventfd could not be created.
    #[error("cannot create the serial interrupt eventfd: {0}")]
    EventFd(#[source] io::Error),
    /// The saved state does not fit a 16550 (its FIFO holds more than 64 bytes).
    #[error("invalid saved serial state: {0}")]
    InvalidState(String),
}

/// Raises the UART's interrupt line through an irqfd.
#[derive(Debug)]
pub struct IrqTrigger(EventFd);

impl IrqTrigger {
    /// A trigger on a new eventfd, to be registered with `Vm::register_irqfd`.
    pub fn new() -> Result<Self, SerialError> {
        EventFd::new(libc::EFD_NONBLOCK)
            .map(IrqTrigger)
            .map_err(SerialError::EventFd)
    }

    /// The eventfd.
    pub fn eventfd(&self) -> &EventFd {
        &self.0
    }
}

impl Trigger for IrqTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// What became of the guest's serial output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SerialReport {
    /// Bytes passed to the output.
    pub bytes_written: u64,
    /// Bytes dropped: past the cap, or after the output failed.
    pub bytes_dropped: u64,
    /// Time from the sink's origin (the start of the VM build) to the end of
    /// the first line.
    pub first_line: Option<Duration>,
    /// Why the output stopped accepting bytes, if it did.
    pub error: Option<String>,
}

/// The UART's output: forwards at most `cap` bytes, then drops the rest and
/// says so once. It never fails towards the UART: a guest must not stall or
/// see errors because the host's log is full or gone.
pub struct SerialSink {
    out: Box<dyn Write + Send>,
    cap: u64,
    origin: Instant,
    capped: bool,
    report: SerialReport,
}

impl std::fmt::Debug for SerialSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SerialSink")
            .field("cap", &self.cap)
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl SerialSink {
    /// A sink writing to `out`, keeping `cap` bytes, timing lines from `origin`.
    pub fn new(out: Box<dyn Write + Send>, cap: u64, origin: Instant) -> Self {
        SerialSink {
            out,
            cap,
            origin,
            capped: false,
            report: SerialReport::default(),
        }
    }

    /// What happened to the output so far.
    pub fn report(&self) -> &SerialReport {
        &self.report
    }

    fn fail(&mut self, err: &io::Error) {
        self.report.error.get_or_insert_with(|| err.to_string());
    }
}

impl Write for SerialSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.report.first_line.is_none() && buf.contains(&b'\n') {
            self.report.first_line = Some(self.origin.elapsed());
        }
        let room = self.cap.saturating_sub(self.report.bytes_written);
        let keep = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let mut sent = 0;
        if self.report.error.is_none() && keep > 0 {
            match self.out.write_all(&buf[..keep]) {
                Ok(()) => sent = keep,
                Err(e) => self.fail(&e),
            }
        }
        if keep < buf.len() && !self.capped && self.report.error.is_none() {
            self.capped = true;
            let note = format!("\n[vmm: serial output capped at {} bytes]\n", self.cap);
            if let Err(e) = self.out.write_all(note.as_bytes()) {
                self.fail(&e);
            }
        }
        self.report.bytes_written += sent as u64;
        self.report.bytes_dropped += (buf.len() - sent) as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.report.error.is_none() {
            if let Err(e) = self.out.flush() {
                self.fail(&e);
            }
        }
        Ok(())
    }
}

/// The UART registers, serialisable (vm-superio's own state type is not).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialDeviceState {
    /// Divisor latch, low byte.
    pub baud_divisor_low: u8,
    /// Divisor latch, high byte.
    pub baud_divisor_high: u8,
    /// Interrupt enable register.
    pub interrupt_enable: u8,
    /// Interrupt identification register.
    pub interrupt_identification: u8,
    /// Line control register.
    pub line_control: u8,
    /// Line status register.
    pub line_status: u8,
    /// Modem control register.
    pub modem_control: u8,
    /// Modem status register.
    pub modem_status: u8,
    /// Scratch register.
    pub scratch: u8,
    /// Received bytes not yet read by the guest.
    pub in_buffer: Vec<u8>,
}

impl From<SerialState> for SerialDeviceState {
    fn from(s: SerialState) -> Self {
        SerialDeviceState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }
}

impl From<&SerialDeviceState> for SerialState {
    fn from(s: &SerialDeviceState) -> Self {
        SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        }
    }
}

/// COM1 on the port bus.
#[derive(Debug)]
pub struct SerialDevice {
    serial: Serial<IrqTrigger, NoEvents, SerialSink>,
}

impl SerialDevice {
    /// A UART in its reset state.
    pub fn new(irq: IrqTrigger, sink: SerialSink) -> Self {
        SerialDevice {
            serial: Serial::new(irq, sink),
        }
    }

    /// A UART restored from `state`.
    pub fn from_state(
        state: &SerialDeviceState,
        irq: IrqTrigger,
        sink: SerialSink,
    ) -> Result<Self, SerialError> {
        Serial::from_state(&state.into(), irq, NoEvents, sink)
            .map(|serial| SerialDevice { serial })
            .map_err(|e| SerialError::InvalidState(e.to_string()))
    }

    /// The UART registers.
    pub fn state(&self) -> SerialDeviceState {
        self.serial.state().into()
    }

    /// What happened to the output.
    pub fn report(&self) -> SerialReport {
        self.serial.writer().report().clone()
    }

    /// The interrupt trigger (its eventfd is registered as an irqfd).
    pub fn irq(&self) -> &IrqTrigger {
        self.serial.interrupt_evt()
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match (u8::try_from(offset), data) {
            (Ok(offset), [byte]) => *byte = self.serial.read(offset),
            (_, data) => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(offset), [value]) = (u8::try_from(offset), data) {
            // The sink never fails; a failed interrupt trigger means the
            // eventfd counter is saturated, i.e. an interrupt is already
            // pending, so there is nothing to do either way.
            let _ = self.serial.write(offset, *value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A `Write` whose bytes the test can read afterwards.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn sink_caps_output_and_says_so_once() {
        let out = Shared::default();
        let mut sink = SerialSink::new(Box::new(out.clone()), 4, Instant::now());
        sink.write_all(b"ab\ncdef").expect("never fails");
        sink.write_all(b"gh").expect("never fails");
        let text = String::from_utf8(out.0.lock().expect("lock").clone()).expect("utf8");
        assert_eq!(text, "ab\nc\n[vmm: serial output capped at 4 bytes]\n");
        let report = sink.report();
        assert_eq!(report.bytes_written, 4);
        assert_eq!(report.bytes_dropped, 5);
        assert!(report.first_line.is_some());
    }

    #[test]
    fn sink_survives_a_failing_output() {
        let mut sink = SerialSink::new(Box::new(Broken), 100, Instant::now());
        sink.write_all(b"abc").expect("never fails");
        sink.write_all(b"d").expect("never fails");
        let report = sink.report();
        assert_eq!(report.bytes_written, 0);
        assert_eq!(report.bytes_dropped, 4);
        assert_eq!(report.error.as_deref(), Some("disk full"));
    }

    #[test]
    fn device_writes_data_register_to_sink_and_raises_irq() {
        let out = Shared::default();
        let sink = SerialSink::new(Box::new(out.clone()), 100, Instant::now());
        let mut dev = SerialDevice::new(IrqTrigger::new().expect("eventfd"), sink);
        dev.write(1, &[0x02]); // IER: THR-empty interrupt on.
        for b in b"hi\n" {
            dev.write(0, &[*b]);
        }
        assert_eq!(out.0.lock().expect("lock").as_slice(), b"hi\n");
        assert!(dev.irq().eventfd().read().expect("irq raised") > 0);
        assert_eq!(dev.report().bytes_written, 3);
    }

    #[test]
    fn state_round_trips_through_serde() {
        let sink = || SerialSink::new(Box::new(io::sink()), 100, Instant::now());
        let mut dev = SerialDevice::new(IrqTrigger::new().expect("eventfd"), sink());
        dev.write(3, &[0x83]); // LCR: DLAB on, 8 bits.
        dev.write(0, &[0x01]); // Divisor low = 1 (115200 baud).
        dev.write(3, &[0x03]); // DLAB off.
        dev.write(7, &[0x5a]); // Scratch.
        let state = dev.state();
        let json = serde_json::to_string(&state).expect("serialise");
        let back: SerialDeviceState = serde_json::from_str(&json).expect("deserialise");
        assert_eq!(back, state);
        let restored = SerialDevice::from_state(&back, IrqTrigger::new().expect("eventfd"), sink())
            .expect("restore");
        assert_eq!(restored.state(), state);
        assert_eq!((state.baud_divisor_low, state.scratch), (1, 0x5a));
    }

    #[test]
    fn oversized_fifo_state_is_refused() {
        let state = SerialDeviceState {
            in_buffer: vec![0; 65],
            ..Default::default()
        };
        let sink = SerialSink::new(Box::new(io::sink()), 100, Instant::now());
        assert!(matches!(
            SerialDevice::from_state(&state, IrqTrigger::new().expect("eventfd"), sink),
            Err(SerialError::InvalidState(_))
        ));
    }
}
