//! The run copy between host pages and slab rows (through `cpkv-copy`)
//! against a plain model: entry by entry, page after page, one piece at a
//! time, as the binding's own copy loop did before the protocol moved here.

mod common;

use common::{Memory, Slab};
use cpkv_slab::{Direction, Entry, HostPages, PageLayout};
use proptest::prelude::*;

/// A pool layout: per entry (buffer, offset, stride - size, size).
fn entries() -> impl Strategy<Value = Vec<(usize, u64, u64, u64)>> {
    prop::collection::vec((0usize..2, 0u64..40, 0u64..6, 1u64..24), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn batches_copy_what_piece_by_piece_copies(
        table in entries(),
        firsts in prop::collection::vec(0i64..12, 1..8),
        which in prop::collection::vec((0usize..8, 0u64..6), 0..14),
        rows in 1usize..7,
        to_slab: bool,
        seed: u64,
    ) {
        let entries: Vec<Entry> = table
            .iter()
            .enumerate()
            .map(|(j, &(b, offset, extra, size))| {
                Entry::checked(j, [b as i64, offset as i64, (size + extra) as i64, 1, size as i64], 2).unwrap()
            })
            .collect();
        let sizes: Vec<u64> = entries.iter().map(|e| e.bytes).collect();
        let host_len = 40 + 12 * 30 + 24;
        let fill = |salt: u64, n: usize| -> Vec<u8> {
            (0..n as u64).map(|i| (i.wrapping_mul(31) ^ salt ^ seed).wrapping_mul(0x9e37_79b9) as u8 >> 1 | 1).collect()
        };
        let mut host = [Memory::with(&fill(1, host_len)), Memory::with(&fill(2, host_len))];
        let mut slab = Slab::new(&sizes, rows);
        let slab_fill = fill(3, slab.data.bytes().len());
        slab.data.bytes_mut().copy_from_slice(&slab_fill);
        let host_regions = vec![host[0].region(host_len), host[1].region(host_len)];
        let (data, stamps, tags) = slab.regions();
        let (layout, memory) = PageLayout::open("kv", sizes.clone(), host_regions.clone(), data, stamps, tags).unwrap();
        let pages = HostPages::from_layout(&entries, &host_regions, &firsts).unwrap();
        let which: Vec<(usize, u64)> = which
            .into_iter()
            .map(|(p, r)| (p % firsts.len(), r % rows as u64))
            .collect();

        // The model: entry by entry, page after page, each piece on its own.
        let mut model_host = [host[0].bytes().to_vec(), host[1].bytes().to_vec()];
        let mut model_slab = slab.data.bytes().to_vec();
        let mut base = 0usize;
        for e in &entries {
            let size = e.bytes as usize;
            for &(page, row) in &which {
                let host_at = (e.offset + firsts[page] as u64 * e.stride) as usize;
                let slab_at = base + row as usize * size;
                if to_slab {
                    let piece = model_host[e.buffer][host_at..host_at + size].to_vec();
                    model_slab[slab_at..slab_at + size].copy_from_slice(&piece);
                } else {
                    let piece = model_slab[slab_at..slab_at + size].to_vec();
                    model_host[e.buffer][host_at..host_at + size].copy_from_slice(&piece);
                }
            }
            base += rows * size;
        }
        let direction = if to_slab { Direction::ToSlab } else { Direction::FromSlab };
        layout.copy_pages(&memory, &pages, &which, direction).unwrap();
        prop_assert_eq!(slab.data.bytes(), &model_slab[..]);
        prop_assert_eq!(host[0].bytes(), &model_host[0][..]);
        prop_assert_eq!(host[1].bytes(), &model_host[1][..]);
    }
}

#[test]
fn a_page_outside_its_buffer_is_named() {
    let entries = [Entry::checked(0, [0, 0, 8, 1, 8], 1).unwrap()];
    let mut host = Memory::zeroed(64);
    let regions = [host.region(64)];
    let outside = HostPages::from_layout(&entries, &regions, &[0, 7, 8]).unwrap_err();
    assert_eq!((outside.page, outside.entry), (2, 0));
    assert!(
        Entry::checked(0, [1, 0, 8, 1, 8], 1).is_err(),
        "buffer 1 of 1"
    );
    assert!(Entry::checked(0, [0, 0, 8, 0, 8], 1).is_err(), "divisor 0");
}

#[test]
fn a_host_buffer_overlapping_the_slab_is_refused() {
    let mut slab = Slab::new(&[8], 4);
    let (data, stamps, tags) = slab.regions();
    let err = PageLayout::open("kv", vec![8], vec![data], data, stamps, tags).unwrap_err();
    assert!(
        err.contains("host buffer 0 overlaps the slab's data"),
        "{err}"
    );
}
