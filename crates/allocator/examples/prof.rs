use cpkv_allocator::PageAllocator;
fn main() {
    let objects = 100_000u64;
    let total = objects + objects / 10;
    let pages = |i: u64| 1 + (i * 7 + i / 3) % 8;
    let capacity: u64 = (0..total).map(pages).sum::<u64>() + 64;
    let mut alloc = PageAllocator::new(&[("kv", capacity), ("index", capacity)]).unwrap();
    let all = alloc.payloads().all();
    for i in 0..total {
        alloc.reserve(i, pages(i), all).unwrap();
    }
    for i in (0..total).filter(|i| i % 11 == 5) {
        alloc.release(i).unwrap();
    }
    let t = std::time::Instant::now();
    let n = 5_000_000;
    for _ in 0..n {
        alloc.reserve(u64::MAX, 5, all).unwrap();
        alloc.release(u64::MAX).unwrap();
    }
    println!("{:?} per pair", t.elapsed() / n);
}
