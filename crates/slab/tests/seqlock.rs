//! The row seqlock against a model of each row's state (published as a
//! key's page, or invalid while a write is under way), and under a real
//! concurrent writer: a read serves a row's bytes only while the row holds
//! the page asked for, before and after the copy.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::{Memory, Slab};
use cpkv_slab::{PageLayout, ReadOutcome, RowWrite};
use proptest::prelude::*;

const SIZES: [u64; 3] = [5, 16, 3];
const PAGE: usize = 24;

#[derive(Clone, Debug)]
enum Op {
    /// Writes the pages (row, handle, tag, fill byte); `fail` stops the write
    /// after its rows are invalidated (a writer that died there).
    Write(Vec<(u64, i64, i64, u8)>, bool),
    /// Reads a row as the page of (handle, tag).
    Read(u64, i64, i64),
}

fn op(rows: u64) -> impl Strategy<Value = Op> {
    let page = (0..rows, 1i64..4, 1i64..3, any::<u8>());
    prop_oneof![
        (prop::collection::vec(page, 1..4), prop::bool::weighted(0.2))
            .prop_map(|(w, f)| Op::Write(w, f)),
        (0..rows, 1i64..4, 1i64..3).prop_map(|(r, h, t)| Op::Read(r, h, t)),
    ]
}

/// What the model says a row is: published (handle, tag, fill), invalid, or never written.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Row {
    Empty,
    Invalid,
    Published(i64, i64, u8),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn reads_serve_exactly_the_published_pages(ops in prop::collection::vec(op(4), 1..30)) {
        let mut slab = Slab::new(&SIZES, 4);
        let (data, stamps, tags) = slab.regions();
        let (layout, memory) = PageLayout::open("kv", SIZES.to_vec(), vec![], data, stamps, tags).unwrap();
        let mut model = [Row::Empty; 4];
        for op in ops {
            match op {
                Op::Write(pages, fail) => {
                    let mut values: Vec<Memory> = pages.iter().map(|p| Memory::with(&[p.3; PAGE])).collect();
                    let regions: Vec<_> = values.iter_mut().map(|m| m.region(PAGE)).collect();
                    let writes: Vec<RowWrite> = pages
                        .iter()
                        .map(|&(row, handle, tag, _)| RowWrite { row, handle, tag })
                        .collect();
                    // A row is skipped when it holds (handle, tag) already (every
                    // row's stamps are checked before any is invalidated).
                    let skip: Vec<bool> = pages
                        .iter()
                        .map(|p| matches!(model[p.0 as usize], Row::Published(h, t, _) if (h, t) == (p.1, p.2)))
                        .collect();
                    let mut mid_write = || -> Result<(), String> {
                        // Under the write, none of its rows reads as its page.
                        for (&(row, handle, tag, _), _) in pages.iter().zip(&skip).filter(|(_, &s)| !s) {
                            let mut out = Memory::zeroed(PAGE);
                            let got = layout.read_page(&memory, row, handle, tag, out.region(PAGE))?;
                            if got != ReadOutcome::Missing {
                                return Err(format!("row {row} read as {got:?} mid-write"));
                            }
                        }
                        if fail { Err("the writer died".into()) } else { Ok(()) }
                    };
                    let written = layout.write_values(&memory, &writes, &regions, &mut mid_write);
                    match written {
                        Err(e) => {
                            prop_assert!(fail && e.contains("died"), "{}", e);
                            for (p, s) in pages.iter().zip(&skip) {
                                if !s { model[p.0 as usize] = Row::Invalid; }
                            }
                        }
                        Ok(n) => {
                            prop_assert!(!fail || skip.iter().all(|&s| s), "a failed write returned Ok");
                            prop_assert_eq!(n, skip.iter().filter(|&&s| !s).count());
                            for (p, s) in pages.iter().zip(&skip) {
                                if !s { model[p.0 as usize] = Row::Published(p.1, p.2, p.3); }
                            }
                        }
                    }
                }
                Op::Read(row, handle, tag) => {
                    let mut out = Memory::zeroed(PAGE);
                    let got = layout.read_page(&memory, row, handle, tag, out.region(PAGE)).unwrap();
                    match model[row as usize] {
                        Row::Published(h, t, fill) if (h, t) == (handle, tag) => {
                            prop_assert_eq!(got, ReadOutcome::Served);
                            prop_assert_eq!(&out.bytes()[..PAGE], &[fill; PAGE][..]);
                        }
                        _ => prop_assert_eq!(got, ReadOutcome::Missing),
                    }
                }
            }
        }
    }
}

#[test]
fn a_row_rewritten_under_a_reader_is_never_served_torn() {
    // One writer rewrites row 0 over and over with pages whose every byte is
    // their handle (tag = handle), each once the reader has started another
    // read of the last one; the reader asks for whatever handle the stamp
    // names, until it has seen 20 copies torn by the writer (or 20,000
    // reads). A served page must be that handle's bytes, and nothing else.
    const BYTES: usize = 64 << 10;
    let sizes = vec![BYTES as u64 / 2; 2];
    let mut slab = Slab::new(&sizes, 1);
    let (data, stamps, tags) = slab.regions();
    let (layout, memory) = PageLayout::open("kv", sizes, vec![], data, stamps, tags).unwrap();
    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let (served, torn) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut value = Memory::zeroed(BYTES);
            let mut handle = 0i64;
            while !stop.load(Ordering::Acquire) {
                handle = handle % 250 + 1;
                value.bytes_mut().fill(handle as u8);
                let region = value.region(BYTES);
                let w = RowWrite {
                    row: 0,
                    handle,
                    tag: handle,
                };
                layout
                    .write_values(&memory, &[w], &[region], &mut || Ok(()))
                    .unwrap();
                // The next write starts while a read of this page is under way.
                let seen = reads.load(Ordering::Acquire);
                while reads.load(Ordering::Acquire) == seen && !stop.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
            }
        });
        // Stops the writer however the reader ends (a failed assertion included).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _stop = Stop(&stop);
        let mut out = Memory::zeroed(BYTES);
        let (mut served, mut torn) = (0, 0);
        for _ in 0..20_000 {
            let handle = memory.stamps().stamp(0).unwrap().abs();
            reads.fetch_add(1, Ordering::Release);
            match layout
                .read_page(&memory, 0, handle, handle, out.region(BYTES))
                .unwrap()
            {
                ReadOutcome::Served => {
                    served += 1;
                    let bad = out.bytes().iter().filter(|&&b| b != handle as u8).count();
                    assert_eq!(
                        bad, 0,
                        "handle {handle} served with {bad} bytes of another page"
                    );
                }
                ReadOutcome::Torn => torn += 1,
                ReadOutcome::Missing => {}
            }
            if torn >= 20 {
                break;
            }
        }
        (served, torn)
    });
    eprintln!("served {served}, torn {torn}");
}

#[test]
fn a_buffer_sharing_the_slab_is_refused() {
    let mut slab = Slab::new(&SIZES, 2);
    let (data, stamps, tags) = slab.regions();
    let (layout, memory) =
        PageLayout::open("kv", SIZES.to_vec(), vec![], data, stamps, tags).unwrap();
    let err = layout.read_page(&memory, 0, 1, 1, data).unwrap_err();
    assert!(err.contains("out overlaps the slab"), "{err}");
}
