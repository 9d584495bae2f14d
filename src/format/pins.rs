//! `timer/pins`: the cancel ledger's reschedule entries below a ledger
//! index, folded into each message's latest (see `timer/pins_snapshot.rs`
//! for who writes it and when it is trusted).
//!
//! The 32-byte file header (magic `DWPINS`, `a` = the ledger index the file
//! covers up to, exclusive; `b` = 0), then the ledger entry at `a - 1`, its
//! 28 bytes as the ledger holds them (the fingerprint), then per pin
//! `message u64 | timer u64 | deliver at ms u64` in increasing message
//! order, then `pins u64 | crc32c u32`, the CRC over everything after the
//! header. Written and read as a stream: a million pins are 24 MB, more
//! than the heap should hold twice. `wheel-format.md` is the byte ruler.

use std::io::{Read, Write};

use crate::error::CorruptionKind;
use crate::format::timer_entry::ENTRY_LEN;
use crate::format::{FILE_HEADER_LEN, FileHeader, PINS_MAGIC, get_u64};

/// Bytes per pin in the file.
pub const PIN_LEN: usize = 24;
/// Bytes after the pins: their number and the CRC.
const TRAILER_LEN: usize = 12;
/// Bytes of a file holding no pin.
pub const EMPTY_FILE_LEN: u64 = (FILE_HEADER_LEN + ENTRY_LEN + TRAILER_LEN) as u64;

/// One pin: the message, the record whose timer its handle reaches, and when that is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilePin {
    /// The message's offset (a handle names it).
    pub message: u64,
    /// The offset of the reschedule record whose timer counts now.
    pub timer: u64,
    /// When that timer is due (epoch ms).
    pub deliver_at_ms: u64,
}

/// What a file covers: the ledger entries below `covered`, the last of
/// which must read as `fingerprint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Covers {
    /// The ledger entries below this index are folded in.
    pub covered: u64,
    /// The ledger's entry at `covered - 1`, as the ledger holds it.
    pub fingerprint: [u8; ENTRY_LEN],
}

/// Pins encoded, checksummed and written together: a call per pin into
/// the CRC and the writer cost more than the pins themselves.
const CHUNK_PINS: usize = 4_096;

/// Writes a pins file to `out`, pin by pin.
pub struct Encoder<W: Write> {
    out: W,
    crc: u32,
    pins: u64,
    last: Option<u64>,
    chunk: Vec<u8>,
}

impl<W: Write> Encoder<W> {
    /// Writes the header and the fingerprint.
    pub fn new(mut out: W, covers: &Covers) -> std::io::Result<Self> {
        out.write_all(&FileHeader::new(PINS_MAGIC, covers.covered, 0).encode())?;
        out.write_all(&covers.fingerprint)?;
        let chunk = Vec::with_capacity(CHUNK_PINS * PIN_LEN);
        Ok(Self { out, crc: crc32c::crc32c(&covers.fingerprint), pins: 0, last: None, chunk })
    }

    /// Appends `pin`, whose message follows the last one's.
    pub fn push(&mut self, pin: FilePin) -> std::io::Result<()> {
        debug_assert!(self.last.is_none_or(|last| last < pin.message), "pins go in message order");
        self.last = Some(pin.message);
        for field in [pin.message, pin.timer, pin.deliver_at_ms] {
            self.chunk.extend_from_slice(&field.to_le_bytes());
        }
        self.pins += 1;
        if self.chunk.len() == CHUNK_PINS * PIN_LEN {
            self.write_chunk()?;
        }
        Ok(())
    }

    fn write_chunk(&mut self) -> std::io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, &self.chunk);
        self.out.write_all(&self.chunk)?;
        self.chunk.clear();
        Ok(())
    }

    /// Writes the trailer; returns the writer and how many pins went in.
    pub fn finish(mut self) -> std::io::Result<(W, u64)> {
        self.chunk.extend_from_slice(&self.pins.to_le_bytes());
        self.write_chunk()?;
        self.out.write_all(&self.crc.to_le_bytes())?;
        Ok((self.out, self.pins))
    }
}

/// Reads a pins file of `len` bytes pin by pin. Nothing read counts until
/// [`next_pin`](Self::next_pin) has answered `Ok(None)`: only the trailer's CRC vouches for the pins.
pub struct Decoder<R: Read> {
    input: R,
    crc: u32,
    /// Pins not yet read from the input.
    left: u64,
    pins: u64,
    last: Option<u64>,
    /// Pins read and checksummed, not yet handed out, from `at`.
    chunk: Vec<u8>,
    at: usize,
}

impl<R: Read> Decoder<R> {
    /// Reads the header and the fingerprint; the length must hold whole pins.
    pub fn open(mut input: R, len: u64) -> Result<(Covers, Self), CorruptionKind> {
        let pins = len
            .checked_sub(EMPTY_FILE_LEN)
            .filter(|body| body % PIN_LEN as u64 == 0)
            .map(|body| body / PIN_LEN as u64)
            .ok_or(CorruptionKind::WrongSize { expected: EMPTY_FILE_LEN, found: len })?;
        let mut header = [0u8; FILE_HEADER_LEN];
        read_exact(&mut input, &mut header)?;
        let header = FileHeader::decode(&header, PINS_MAGIC).map_err(|p| match p.kind() {
            Ok(kind) => kind,
            Err(version) => CorruptionKind::BadFrame(format!("pins file of version {version}")),
        })?;
        if header.b != 0 {
            return Err(CorruptionKind::BadReference(format!("pins header field b is {}, not 0", header.b)));
        }
        // Each pin comes from a distinct ledger entry below `a`: a length
        // claiming more is refused before anything is read into memory.
        if pins >= header.a.max(1) {
            let why = format!("{pins} pins from the ledger entries below {}", header.a);
            return Err(CorruptionKind::BadReference(why));
        }
        let mut fingerprint = [0u8; ENTRY_LEN];
        read_exact(&mut input, &mut fingerprint)?;
        let covers = Covers { covered: header.a, fingerprint };
        let crc = crc32c::crc32c(&fingerprint);
        Ok((covers, Self { input, crc, left: pins, pins, last: None, chunk: Vec::new(), at: 0 }))
    }

    /// How many pins the file's length says it holds.
    pub fn pins(&self) -> u64 {
        self.pins
    }

    /// The next pin; `Ok(None)` after the last, once the trailer checks out.
    pub fn next_pin(&mut self) -> Result<Option<FilePin>, CorruptionKind> {
        if self.at == self.chunk.len() {
            if self.left == 0 {
                return self.check_trailer().map(|()| None);
            }
            // At most `CHUNK_PINS`: `left` came from the file's length.
            let n = self.left.min(CHUNK_PINS as u64) as usize;
            self.chunk.resize(n * PIN_LEN, 0);
            read_exact(&mut self.input, &mut self.chunk)?;
            self.crc = crc32c::crc32c_append(self.crc, &self.chunk);
            (self.left, self.at) = (self.left - n as u64, 0);
        }
        let bytes = &self.chunk[self.at..self.at + PIN_LEN];
        self.at += PIN_LEN;
        let pin = FilePin {
            message: get_u64(bytes, 0),
            timer: get_u64(bytes, 8),
            deliver_at_ms: get_u64(bytes, 16),
        };
        if self.last.is_some_and(|last| last >= pin.message) || pin.timer <= pin.message {
            let why = format!("pin of message {} (timer {}) out of order", pin.message, pin.timer);
            return Err(CorruptionKind::BadReference(why));
        }
        self.last = Some(pin.message);
        Ok(Some(pin))
    }

    fn check_trailer(&mut self) -> Result<(), CorruptionKind> {
        let mut trailer = [0u8; TRAILER_LEN];
        read_exact(&mut self.input, &mut trailer)?;
        let computed = crc32c::crc32c_append(self.crc, &trailer[..8]);
        let stored = u32::from_le_bytes([trailer[8], trailer[9], trailer[10], trailer[11]]);
        if stored != computed {
            return Err(CorruptionKind::ChecksumMismatch { stored, computed });
        }
        if get_u64(&trailer, 0) != self.pins {
            return Err(CorruptionKind::BadReference("pin count disagrees with the length".into()));
        }
        Ok(())
    }
}

fn read_exact(input: &mut impl Read, into: &mut [u8]) -> Result<(), CorruptionKind> {
    input.read_exact(into).map_err(|e| CorruptionKind::BadReference(format!("pins file cannot be read: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::hex;

    fn write(covers: &Covers, pins: &[FilePin]) -> Vec<u8> {
        let mut encoder = Encoder::new(Vec::new(), covers).unwrap();
        pins.iter().for_each(|&pin| encoder.push(pin).unwrap());
        encoder.finish().unwrap().0
    }

    fn read(bytes: &[u8]) -> Result<(Covers, Vec<FilePin>), CorruptionKind> {
        let (covers, mut decoder) = Decoder::open(bytes, bytes.len() as u64)?;
        let mut pins = Vec::new();
        while let Some(pin) = decoder.next_pin()? {
            pins.push(pin);
        }
        Ok((covers, pins))
    }

    #[test]
    fn golden_bytes_match_wheel_format_md() {
        let fingerprint = [0x11; ENTRY_LEN];
        let covers = Covers { covered: 7, fingerprint };
        let pin = FilePin { message: 32, timer: 4096, deliver_at_ms: 1_700_000_001_000 };
        let bytes = write(&covers, &[pin]);
        assert_eq!(bytes.len() as u64, EMPTY_FILE_LEN + PIN_LEN as u64);
        // The same hex stands in wheel-format.md, "Pins snapshot".
        assert_eq!(
            hex(&bytes[..28]),
            "445750494e53000001000000 0700000000000000 0000000000000000".replace(' ', "")
        );
        assert_eq!(hex(&bytes[FILE_HEADER_LEN..FILE_HEADER_LEN + ENTRY_LEN]), "11".repeat(ENTRY_LEN));
        assert_eq!(
            hex(&bytes[FILE_HEADER_LEN + ENTRY_LEN..]),
            "2000000000000000 0010000000000000 e86be5cf8b010000 0100000000000000 2126f4b1".replace(' ', "")
        );
        assert_eq!(read(&bytes), Ok((covers, vec![pin])));
    }

    #[test]
    fn a_flipped_bit_a_short_file_or_pins_out_of_order_are_refused() {
        // More pins than a chunk: the checksum runs across chunks.
        let covers = Covers { covered: 10_000, fingerprint: [7; ENTRY_LEN] };
        let pins: Vec<FilePin> =
            (1..=5_000).map(|m| FilePin { message: m * 100, timer: m * 100 + 1, deliver_at_ms: m }).collect();
        let bytes = write(&covers, &pins);
        assert_eq!(read(&bytes), Ok((covers, pins.clone())));
        for at in [FILE_HEADER_LEN + 3, FILE_HEADER_LEN + ENTRY_LEN + 30, bytes.len() - 5] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 1;
            assert!(read(&flipped).is_err(), "bit flipped at {at}");
        }
        assert!(read(&bytes[..bytes.len() - 1]).is_err());
        assert!(read(&bytes[..bytes.len() - PIN_LEN]).is_err(), "a whole pin short: the count disagrees");
        // More pins than ledger entries below the covered index, or a header
        // field that is not 0: refused before any pin is read.
        let few = Covers { covered: 5_000, ..covers };
        assert!(matches!(read(&write(&few, &pins)), Err(CorruptionKind::BadReference(_))));
        let mut other_b = bytes.clone();
        other_b[..FILE_HEADER_LEN].copy_from_slice(&FileHeader::new(PINS_MAGIC, 10_000, 1).encode());
        assert!(matches!(read(&other_b), Err(CorruptionKind::BadReference(_))));
        let swapped = [
            FilePin { message: 9, timer: 10, deliver_at_ms: 0 },
            FilePin { message: 8, timer: 10, deliver_at_ms: 0 },
        ];
        let mut encoder = Encoder::new(Vec::new(), &covers).unwrap();
        for pin in swapped {
            // Past `push`'s order check.
            encoder.last = None;
            encoder.push(pin).unwrap();
        }
        let bytes = encoder.finish().unwrap().0;
        assert!(matches!(read(&bytes), Err(CorruptionKind::BadReference(_))));
    }
}
