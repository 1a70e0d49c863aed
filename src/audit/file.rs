//! The audit file: appended to, rotated by size, and read back at start so the chain
//! goes on where the last process left it.
//!
//! Rotation: when the next line would take the file past `audit.max_file_bytes`, `FILE`
//! becomes `FILE.1` (`FILE.1` becomes `FILE.2`, and so on; past `audit.max_files` the
//! oldest is removed) and a new `FILE` starts; its first record carries the hash of the
//! last line of `FILE.1`, so `aipgw audit verify FILE.2 FILE.1 FILE` checks one chain.
//!
//! One writer per chain: the writer holds an exclusive lock (`flock`) on `FILE.lock`, a
//! file that is never rotated, from before it reads where the chain stands until the
//! process ends. Another process on the same file (the new one of a take-over, while the
//! old one drains; or a second instance pointed at it by mistake) waits for the lock
//! before it reads the chain, so the chain never forks: its start record follows the
//! other's stop record.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::record::{Chain, SEQ};

/// How much of a file's end is read to find its last record.
const TAIL: u64 = 1 << 20;

/// The open audit file and the chain's state.
#[derive(Debug)]
pub(crate) struct ChainFile {
    path: PathBuf,
    file: File,
    /// `FILE.lock`, locked while this is open.
    _lock: File,
    size: u64,
    max_bytes: u64,
    max_files: usize,
    /// Where the chain stands.
    pub(crate) chain: Chain,
}

impl ChainFile {
    /// Takes the lock on `path` (`FILE.lock`) if no other process holds it, then opens
    /// (or creates) `path` for appending and reads where its chain stands (from
    /// `FILE.1` if `FILE` is empty: a rotation just happened). `None`: the lock is held.
    pub(crate) fn try_open(
        path: &Path,
        max_bytes: u64,
        max_files: usize,
    ) -> anyhow::Result<Option<ChainFile>> {
        let lock_path = lock_path(path);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| anyhow::anyhow!("audit.file {}: {e}", lock_path.display()))?;
        match rustix::fs::flock(
            lock.as_fd(),
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(e) => anyhow::bail!("audit.file {}: lock: {e}", lock_path.display()),
        }
        let mut file = open_append(path)?;
        let mut chain = last_record(&mut file)?;
        if chain.is_none() {
            if let Ok(mut older) = File::open(rotated(path, 1)) {
                chain = last_record(&mut older)?;
            }
        }
        let size = file.metadata()?.len();
        let mut this = ChainFile {
            path: path.to_path_buf(),
            file,
            _lock: lock,
            size,
            max_bytes,
            max_files,
            chain: chain.unwrap_or_default(),
        };
        // A line cut short (a crash mid-write) stays as it is: the next record starts on
        // a line of its own, and `audit verify` reports the cut one.
        if this.size > 0 && !ends_with_newline(&mut this.file)? {
            this.file.write_all(b"\n")?;
            this.size += 1;
        }
        Ok(Some(this))
    }

    /// Whether `line` and its newline fit in the current file (else
    /// [`ChainFile::rotate`] first).
    pub(crate) fn fits(&self, line: &str) -> bool {
        self.size == 0 || self.size + (line.len() as u64) < self.max_bytes
    }

    /// Appends one line (and its newline).
    pub(crate) fn append(&mut self, line: &str) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        self.file.write_all(&buf)?;
        self.size += buf.len() as u64;
        Ok(())
    }

    /// Moves the file aside (`FILE.1`, ...) and starts a new one; the chain goes on.
    pub(crate) fn rotate(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        let _ = std::fs::remove_file(rotated(&self.path, self.max_files));
        for i in (1..self.max_files).rev() {
            let from = rotated(&self.path, i);
            if from.exists() {
                std::fs::rename(&from, rotated(&self.path, i + 1))?;
            }
        }
        std::fs::rename(&self.path, rotated(&self.path, 1))?;
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&self.path)?;
        self.size = 0;
        Ok(())
    }

    /// Hands what was written to the operating system.
    pub(crate) fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Opens (or creates) `path` for appending (and reading its tail).
pub(crate) fn open_append(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("audit.file {}: {e}", path.display()))
}

/// `FILE.lock`.
fn lock_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

/// `FILE.n`.
pub(crate) fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

fn ends_with_newline(file: &mut File) -> std::io::Result<bool> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(true);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut b = [0u8; 1];
    file.read_exact(&mut b)?;
    Ok(b[0] == b'\n')
}

/// The chain's state after the file's last complete record (`None`: it has none).
fn last_record(file: &mut File) -> anyhow::Result<Option<Chain>> {
    let len = file.metadata()?.len();
    let start = len.saturating_sub(TAIL);
    file.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::new();
    file.take(TAIL).read_to_end(&mut tail)?;
    // Complete lines only: what follows the last newline was cut short.
    let Some(end) = tail.iter().rposition(|b| *b == b'\n') else {
        return Ok(None);
    };
    let complete = &tail[..end];
    let begin = complete
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let line = &complete[begin..];
    if line.is_empty() {
        return Ok(None);
    }
    let v: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
        anyhow::anyhow!(
            "audit.file: its last record is not JSON ({e}): run `aipgw audit verify` on it"
        )
    })?;
    let seq = v["attributes"][SEQ]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("audit.file: its last record has no {SEQ}"))?;
    Ok(Some(Chain {
        seq: seq + 1,
        prev: Some(crate::identity::sha256_hex(line)),
        kid: v["integrity"]["kid"].as_str().map(str::to_owned),
    }))
}
