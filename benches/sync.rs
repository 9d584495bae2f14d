//! What one sync of appended commit-log bytes costs, by the call that makes
//! them durable: `msync` of the written range (what the log does), `fdatasync`
//! of the segment file, and `sync_file_range` of the range followed by
//! `fdatasync`. On Linux all three write back the mapped dirty pages (the
//! page cache is shared by the map and the file). Each iteration writes
//! `chunk` bytes through the map past the last ones, as appends do, then
//! syncs, on a preallocated, zero-filled and synced file like a segment.
//!
//! `cargo bench --bench sync`
// The map, and the one system call rustix does not offer.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use memmap2::MmapMut;

const FILE_LEN: usize = 256 << 20;

#[derive(Clone, Copy, Debug)]
enum Method {
    Msync,
    Fdatasync,
    SyncFileRangeFdatasync,
}

/// A segment-like file, mapped: written whole with zeros and synced.
fn segment(dir: &std::path::Path) -> (File, MmapMut) {
    let path = dir.join("segment");
    let mut file =
        File::options().read(true).write(true).create(true).truncate(true).open(&path).expect("create");
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..FILE_LEN >> 20 {
        file.write_all(&zeros).expect("zero");
    }
    file.sync_all().expect("sync");
    // SAFETY: the file is this benchmark's own temporary file; nothing else
    // maps, truncates or writes it while the map lives.
    let map = unsafe { MmapMut::map_mut(&file) }.expect("map");
    (file, map)
}

fn sync(method: Method, file: &File, map: &MmapMut, offset: usize, len: usize) {
    match method {
        Method::Msync => map.flush_range(offset, len).expect("msync"),
        Method::Fdatasync => rustix::fs::fdatasync(file).expect("fdatasync"),
        Method::SyncFileRangeFdatasync => {
            let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER;
            // SAFETY: a plain system call on an open descriptor with an in-bounds range; no memory is passed.
            let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, flags) };
            assert_eq!(rc, 0, "sync_file_range: {}", std::io::Error::last_os_error());
            rustix::fs::fdatasync(file).expect("fdatasync");
        }
    }
}

fn sync_methods(c: &mut Criterion) {
    let mut group = c.benchmark_group("sync");
    group.sample_size(20).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let (file, mut map) = segment(dir.path());
    let mut at = 0;
    for chunk in [4usize << 10, 64 << 10, 1 << 20] {
        group.throughput(Throughput::Bytes(chunk as u64));
        for method in [Method::Msync, Method::Fdatasync, Method::SyncFileRangeFdatasync] {
            group.bench_with_input(BenchmarkId::new(format!("{method:?}"), chunk), &chunk, |b, &chunk| {
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for i in 0..iters {
                        if at + chunk > FILE_LEN {
                            at = 0;
                        }
                        map[at..at + chunk].fill(i as u8 | 1);
                        let started = Instant::now();
                        sync(method, &file, &map, at, chunk);
                        spent += started.elapsed();
                        at += chunk;
                    }
                    spent
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, sync_methods);
criterion_main!(benches);
