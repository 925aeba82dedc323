//! TensorBoard's event file format, for scalars: what `tf.summary` and PyTorch's
//! `SummaryWriter` write and `tensorboard.backend.event_processing.event_accumulator` reads.
//!
//! A file is a sequence of TFRecords (TensorFlow `core/lib/io/record_writer.cc`):
//!
//! ```text
//! u64 length (little-endian) | u32 masked_crc32c(length bytes) | data[length] | u32 masked_crc32c(data)
//! masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8   (wrapping, crc = CRC-32C of x)
//! ```
//!
//! and each record's data is one `tensorflow.Event` protobuf (`core/util/event.proto`,
//! `core/framework/summary.proto`), of which these fields are used: `wall_time` (1, seconds
//! since the epoch), `step` (2), `file_version` (3: `"brain.Event:2"` in the first record),
//! `summary` (5: `value { tag (1), simple_value (2) }`), `session_log` (7: `status` START
//! marks a restart, and TensorBoard drops what the file set holds at or after its step: a
//! resumed run's lines past its checkpoint). The messages are declared here with
//! `prost`'s derive (no `.proto` compilation).

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// `tensorflow.Event` (the fields used for scalars).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
    #[prost(message, optional, tag = "7")]
    pub session_log: Option<SessionLog>,
}

/// `tensorflow.Summary`: a list of tagged values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<Value>,
}

/// `tensorflow.Summary.Value` holding a scalar.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// `tensorflow.SessionLog` (`status`: 1 = START, a (re)start at the event's step).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionLog {
    #[prost(int32, tag = "1")]
    pub status: i32,
}

/// `SessionLog.status` of a (re)start.
pub const SESSION_START: i32 = 1;

/// The CRC that TFRecord stores: CRC-32C, rotated and offset (so that a CRC of data holding
/// CRCs does not degenerate).
pub fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends events to a new event file, flushing each, so TensorBoard can follow a live run.
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// Create `dir/events.out.tfevents.<unix seconds>.<host>.<pid>` (TensorBoard reads every
    /// such file in a folder, in name order) and write the file-version record.
    ///
    /// # Errors
    /// The folder or file cannot be created or written.
    pub fn create(dir: &Path) -> Result<EventWriter> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
        let host = if host.is_empty() { "localhost".to_string() } else { host };
        let path = dir.join(format!("events.out.tfevents.{:010}.{host}.{}", now.as_secs(), std::process::id()));
        let file = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut w = EventWriter { out: BufWriter::new(file), path };
        w.write(&Event { wall_time: now.as_secs_f64(), file_version: Some("brain.Event:2".into()), ..Event::default() })?;
        Ok(w)
    }

    /// Append `event` as one record.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write(&mut self, event: &Event) -> Result<()> {
        let data = prost::Message::encode_to_vec(event);
        let len = (data.len() as u64).to_le_bytes();
        let record = [&len[..], &masked_crc(&len).to_le_bytes(), &data, &masked_crc(&data).to_le_bytes()].concat();
        self.out.write_all(&record).and_then(|_| self.out.flush()).with_context(|| format!("cannot write {}", self.path.display()))
    }

    /// Append scalars `(tag, value)` at `step`, stamped now.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn scalars(&mut self, step: u64, values: Vec<(String, f32)>) -> Result<()> {
        let value = values.into_iter().map(|(tag, v)| Value { tag, simple_value: Some(v) }).collect();
        self.write(&Event { wall_time: wall_time(), step: step as i64, summary: Some(Summary { value }), ..Event::default() })
    }

    /// Mark a (re)start at `step`: TensorBoard drops the events of earlier files at `step` or
    /// later.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn start_at(&mut self, step: u64) -> Result<()> {
        let session_log = Some(SessionLog { status: SESSION_START });
        self.write(&Event { wall_time: wall_time(), step: step as i64, session_log, ..Event::default() })
    }
}

fn wall_time() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// Every event of an event file, each record's length and data checked against its CRCs.
///
/// # Errors
/// The file cannot be read; a record is cut short, fails its CRC or is not an `Event` (naming
/// the file and the record's byte offset).
pub fn read_events(path: &Path) -> Result<Vec<Event>> {
    let mut r = BufReader::new(File::open(path).with_context(|| format!("cannot open {}", path.display()))?);
    let mut events = Vec::new();
    let mut offset = 0u64;
    loop {
        let mut head = [0u8; 12];
        match r.read_exact(&mut head[..1]) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(events),
            other => other.with_context(|| format!("{}: cannot read", path.display()))?,
        }
        let at = |what: &str| format!("{} at byte {offset}: {what}", path.display());
        r.read_exact(&mut head[1..]).with_context(|| at("a record cut short"))?;
        let (len, crc) = (&head[..8], u32::from_le_bytes(head[8..].try_into().expect("4 bytes")));
        if masked_crc(len) != crc {
            bail!(at("the length's CRC does not match"));
        }
        let n = u64::from_le_bytes(len.try_into().expect("8 bytes"));
        let mut data = vec![0u8; n as usize + 4];
        r.read_exact(&mut data).with_context(|| at("a record cut short"))?;
        let crc = u32::from_le_bytes(data[n as usize..].try_into().expect("4 bytes"));
        if masked_crc(&data[..n as usize]) != crc {
            bail!(at("the data's CRC does not match"));
        }
        events.push(<Event as prost::Message>::decode(&data[..n as usize]).with_context(|| at("not an Event"))?);
        offset += 16 + n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crc_is_tensorflows() {
        // CRC-32C check value (RFC 3720 B.4: 32 bytes of zeros -> 0x8a9136aa), then masked
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(masked_crc(&[0u8; 32]), 0x8a91_36aau32.rotate_right(15).wrapping_add(0xa282_ead8));
        // the first 12 bytes of a TensorFlow event file: the file-version event's length (24)
        // and its masked CRC, a3 7f 4b 22
        assert_eq!(masked_crc(&24u64.to_le_bytes()).to_le_bytes(), [0xa3, 0x7f, 0x4b, 0x22]);
    }

    #[test]
    fn events_encode_as_tensorflows_protobuf() {
        // the bytes of TensorBoard's own event_pb2 for the same events (SerializeToString)
        let hex = |e: &Event| prost::Message::encode_to_vec(e).iter().map(|b| format!("{b:02x}")).collect::<String>();
        let start = Event { step: 5, session_log: Some(SessionLog { status: SESSION_START }), ..Event::default() };
        assert_eq!(hex(&start), "10053a020801");
        let value = vec![Value { tag: "train/loss".into(), simple_value: Some(2.5) }];
        let scalar = Event { wall_time: 1.5, step: 7, summary: Some(Summary { value }), ..Event::default() };
        assert_eq!(hex(&scalar), "09000000000000f83f10072a130a110a0a747261696e2f6c6f73731500002040");
        let version = Event { file_version: Some("brain.Event:2".into()), ..Event::default() };
        assert_eq!(hex(&version), "1a0d627261696e2e4576656e743a32");
    }

    #[test]
    fn records_read_back_and_a_flipped_bit_is_caught() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(tmp.path()).unwrap();
        w.scalars(7, vec![("train/loss".into(), 2.5), ("train/lr".into(), 1e-3)]).unwrap();
        w.start_at(8).unwrap();
        let path = w.path.clone();
        drop(w);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        let ev = read_events(&path).unwrap();
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(ev[1].step, 7);
        let values = &ev[1].summary.as_ref().unwrap().value;
        assert_eq!((values[0].tag.as_str(), values[0].simple_value), ("train/loss", Some(2.5)));
        assert_eq!((values[1].tag.as_str(), values[1].simple_value), ("train/lr", Some(1e-3)));
        assert_eq!((ev[2].step, ev[2].session_log.as_ref().unwrap().status), (8, SESSION_START));

        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 6;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = read_events(&path).unwrap_err().to_string();
        assert!(e.contains("the data's CRC does not match"), "{e}");
        std::fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
        assert!(read_events(&path).unwrap_err().to_string().contains("cut short"));
    }
}
