//! The free pages of one payload pool: one bit per page (set: free) and a
//! summary bit per word (set: the word has a free page).
//!
//! Freeing pages sets their bits, so adjacent frees coalesce by
//! construction and a free costs no search. First fit (the lowest-addressed
//! run of `len` free pages) walks the summary's set bits in address order
//! and tests each word with word operations, never visiting a full word;
//! taking the lowest free pages walks the same way. Words are stored only
//! up to the highest page ever taken: the pages past them are free, so a
//! pool's memory follows its use, not its capacity. The free extents are
//! the maximal runs of set bits, in address order.

use crate::extent::Extent;
use crate::placement::ExtentVec;

#[derive(Clone, Debug)]
pub struct FreeBits {
    capacity: u64,
    /// Bit `p % 64` of word `p / 64` is set when page `p` is free. Pages
    /// from `stored_end()` up to `capacity` are free and not stored; bits
    /// at or past `capacity` are clear.
    words: Vec<u64>,
    /// Bit `w % 64` of word `w / 64` is set when `words[w] != 0`.
    open: Vec<u64>,
    free_pages: u64,
}

impl FreeBits {
    /// A pool of `capacity` pages, all free.
    pub fn new(capacity: u64) -> Self {
        FreeBits {
            capacity,
            words: Vec::new(),
            open: Vec::new(),
            free_pages: capacity,
        }
    }

    /// A pool of `capacity` pages whose free pages are exactly `extents`
    /// (restore, which validated them: in the pool, disjoint, in address
    /// order). Words are stored up to where the free tail begins.
    pub fn from_extents(capacity: u64, extents: &[Extent]) -> Self {
        let stored = match extents.last() {
            Some(last) if last.end() == capacity => last.start,
            _ => capacity,
        };
        let mut bits = FreeBits::new(capacity);
        // Stored words start free: mark them used, then free the extents
        // below the tail.
        bits.take_range(0, stored);
        for &extent in extents.iter().filter(|e| e.end() <= stored) {
            bits.give_back(extent);
        }
        bits
    }

    pub fn free_pages(&self) -> u64 {
        self.free_pages
    }

    pub fn extent_count(&self) -> usize {
        self.runs().count()
    }

    pub fn largest(&self) -> u64 {
        self.runs().map(|e| e.len).max().unwrap_or(0)
    }

    /// Every free extent in address order.
    pub fn extents(&self) -> Vec<Extent> {
        self.runs().collect()
    }

    /// Takes `len` pages from the start of the lowest-addressed free extent
    /// that holds them all; `None` (nothing taken) if none does.
    pub fn take_first_fit(&mut self, len: u64) -> Option<Extent> {
        if len == 0 || len > self.free_pages {
            return None;
        }
        let start = self.first_fit(len)?;
        self.take_range(start, len);
        Some(Extent::new(start, len))
    }

    /// Takes the lowest-addressed `len` free pages (no more than are free):
    /// whole extents in address order, the last one from its start; appends
    /// them to `taken`.
    pub(crate) fn take_prefix(&mut self, len: u64, taken: &mut ExtentVec) {
        self.take_prefix_each(len, |e| taken.push(e));
    }

    /// A batch of `len` pages (no more than are free), placed as one
    /// object's: the front of the lowest-addressed extent that holds them
    /// all, else the lowest free pages (`take_prefix`). Hands each extent
    /// taken to `each`, in address order.
    pub(crate) fn take_batch(&mut self, len: u64, mut each: impl FnMut(Extent)) {
        if len == self.free_pages {
            // Every free page goes, as one extent if first fit finds one:
            // the same pages either way, in one walk.
            return self.take_prefix_each(len, each);
        }
        match self.take_first_fit(len) {
            Some(extent) => each(extent),
            None => self.take_prefix_each(len, each),
        }
    }

    /// `take_batch` for pages held by number: the same pages, handed to
    /// `each` word by word as `(word index, taken bits)` in address order,
    /// so a caller that keeps its own bit per page sets a word at a time.
    #[inline]
    pub(crate) fn take_batch_bits(&mut self, len: u64, mut each: impl FnMut(usize, u64)) {
        if len != self.free_pages {
            if let Some(extent) = self.take_first_fit(len) {
                let (mut page, end) = (extent.start, extent.end());
                while page < end {
                    let (w, mask) = word_mask(page, end);
                    each(w, mask);
                    page = (w as u64 + 1) * 64;
                }
                return;
            }
        }
        self.take_lowest_bits(len, each);
    }

    /// Takes the lowest `len` free pages (no more than are free), handing
    /// each word's taken bits to `each` in address order.
    fn take_lowest_bits(&mut self, len: u64, mut each: impl FnMut(usize, u64)) {
        assert!(
            len <= self.free_pages,
            "only {} pages free",
            self.free_pages
        );
        let mut missing = len;
        for s in 0..self.open.len() {
            while self.open[s] != 0 && missing > 0 {
                let w = s * 64 + self.open[s].trailing_zeros() as usize;
                let word = self.words[w];
                let count = u64::from(word.count_ones());
                let taken = if count <= missing {
                    word
                } else {
                    lowest_set_bits(word, missing)
                };
                missing -= count.min(missing);
                self.words[w] = word & !taken;
                if self.words[w] == 0 {
                    self.open[s] &= !(1 << (w % 64));
                }
                each(w, taken);
            }
            if missing == 0 {
                break;
            }
        }
        self.free_pages -= len - missing;
        if missing > 0 {
            let (mut page, end) = (self.stored_end(), self.stored_end() + missing);
            self.take_range(page, missing);
            while page < end {
                let (w, mask) = word_mask(page, end);
                each(w, mask);
                page = (w as u64 + 1) * 64;
            }
        }
    }

    /// Returns used page `page` to the pool.
    #[inline]
    pub fn give_back_page(&mut self, page: u64) {
        debug_assert!(page < self.stored_end(), "only taken pages come back");
        let w = (page / 64) as usize;
        debug_assert_eq!(self.words[w] >> (page % 64) & 1, 0, "page freed twice");
        self.words[w] |= 1 << (page % 64);
        self.open[w / 64] |= 1 << (w % 64);
        self.free_pages += 1;
    }

    /// Returns `extent` (used pages of this pool) to the pool; it joins the
    /// free pages on either side by construction.
    #[inline]
    pub fn give_back(&mut self, extent: Extent) {
        let (mut page, end) = (extent.start, extent.end());
        debug_assert!(end <= self.stored_end(), "only taken pages come back");
        while page < end {
            let (w, mask) = word_mask(page, end);
            debug_assert_eq!(self.words[w] & mask, 0, "page freed twice");
            self.words[w] |= mask;
            self.open[w / 64] |= 1 << (w % 64);
            page = (w as u64 + 1) * 64;
        }
        self.free_pages += extent.len;
    }

    /// Checks the bookkeeping (summary bits, page count, bits past the
    /// capacity) against the words; returns what is wrong.
    pub fn check_structure(&self) -> Result<(), String> {
        if self.open.len() != self.words.len().div_ceil(64) {
            return Err("summary length differs from the words'".into());
        }
        for (w, &word) in self.words.iter().enumerate() {
            if (self.open[w / 64] >> (w % 64) & 1 == 1) != (word != 0) {
                return Err(format!("summary bit of word {w} is stale"));
            }
        }
        if self.words.len() % 64 != 0
            && self
                .open
                .last()
                .is_some_and(|&s| s >> (self.words.len() % 64) != 0)
        {
            return Err("summary bits past the stored words".into());
        }
        if self.stored_end() < 64 * self.words.len() as u64 {
            let last = self.words.last().copied().unwrap_or(0);
            if last >> (self.capacity % 64) != 0 {
                return Err("free bits past the capacity".into());
            }
        }
        let stored: u64 = self.words.iter().map(|w| u64::from(w.count_ones())).sum();
        let pages = stored + (self.capacity - self.stored_end());
        if pages != self.free_pages {
            return Err(format!(
                "count says {} free pages, the bits hold {pages}",
                self.free_pages
            ));
        }
        Ok(())
    }

    /// Where the stored words end (pages from here to `capacity` are free).
    #[inline]
    fn stored_end(&self) -> u64 {
        (64 * self.words.len() as u64).min(self.capacity)
    }

    /// Stores words (all free) up to page `end`.
    fn store_up_to(&mut self, end: u64) {
        let words = end.div_ceil(64) as usize;
        if words <= self.words.len() {
            return;
        }
        let from = self.words.len();
        self.words.resize(words, u64::MAX);
        if self.capacity < 64 * words as u64 {
            *self.words.last_mut().expect("stored above") = (1 << (self.capacity % 64)) - 1;
        }
        self.open.resize(words.div_ceil(64), 0);
        for w in from..words {
            self.open[w / 64] |= 1 << (w % 64);
        }
    }

    /// Marks free pages `[start, start + len)` used.
    #[inline]
    fn take_range(&mut self, start: u64, len: u64) {
        let end = start + len;
        if end > self.stored_end() {
            self.store_up_to(end);
        }
        let mut page = start;
        while page < end {
            let (w, mask) = word_mask(page, end);
            debug_assert_eq!(self.words[w] & mask, mask, "page taken twice");
            self.words[w] &= !mask;
            if self.words[w] == 0 {
                self.open[w / 64] &= !(1 << (w % 64));
            }
            page = (w as u64 + 1) * 64;
        }
        self.free_pages -= len;
    }

    /// `take_prefix` handing each extent taken to `each`, in address order:
    /// one walk over the words with a free page, then the unstored tail.
    fn take_prefix_each(&mut self, len: u64, mut each: impl FnMut(Extent)) {
        assert!(
            len <= self.free_pages,
            "only {} pages free",
            self.free_pages
        );
        let mut missing = len;
        // The run taken last, handed out once the next one does not touch it.
        let mut run: Option<Extent> = None;
        let mut add = |start: u64, len: u64| match &mut run {
            Some(last) if last.end() == start => last.len += len,
            last => {
                if let Some(done) = last.replace(Extent::new(start, len)) {
                    each(done);
                }
            }
        };
        for s in 0..self.open.len() {
            while self.open[s] != 0 && missing > 0 {
                let w = s * 64 + self.open[s].trailing_zeros() as usize;
                let (mut word, base) = (self.words[w], w as u64 * 64);
                while word != 0 && missing > 0 {
                    let low = u64::from(word.trailing_zeros());
                    let take = u64::from((word >> low).trailing_ones()).min(missing);
                    word &= !bit_mask(low, take);
                    missing -= take;
                    add(base + low, take);
                }
                self.words[w] = word;
                if word == 0 {
                    self.open[s] &= !(1 << (w % 64));
                }
            }
            if missing == 0 {
                break;
            }
        }
        self.free_pages -= len - missing;
        if missing > 0 {
            let tail = self.stored_end();
            self.take_range(tail, missing);
            add(tail, missing);
        }
        if let Some(last) = run {
            each(last);
        }
    }

    /// The start of the lowest-addressed run of `len` (>= 1) free pages.
    #[inline]
    fn first_fit(&self, len: u64) -> Option<u64> {
        // The free run that ends where the last word visited ends.
        let (mut run_start, mut run_len) = (0u64, 0u64);
        let mut next_word = 0usize;
        for (s, &summary) in self.open.iter().enumerate() {
            let mut open = summary;
            while open != 0 {
                let w = s * 64 + open.trailing_zeros() as usize;
                open &= open - 1;
                if w != next_word {
                    run_len = 0;
                }
                next_word = w + 1;
                let (word, base) = (self.words[w], w as u64 * 64);
                // The run from the words before, on into this word's low bits.
                if run_len == 0 {
                    run_start = base;
                }
                run_len += u64::from(word.trailing_ones());
                if run_len >= len {
                    return Some(run_start);
                }
                if word == u64::MAX {
                    continue;
                }
                if len <= 64 {
                    let starts = run_starts(word, len);
                    if starts != 0 {
                        return Some(base + u64::from(starts.trailing_zeros()));
                    }
                }
                let high = u64::from(word.leading_ones());
                (run_start, run_len) = (base + 64 - high, high);
            }
        }
        let tail = self.stored_end();
        if tail == self.capacity {
            return None;
        }
        if next_word != self.words.len() || run_len == 0 {
            (run_start, run_len) = (tail, 0);
        }
        (run_len + self.capacity - tail >= len).then_some(run_start)
    }

    /// The lowest free page at or after `page`.
    fn free_from(&self, page: u64) -> Option<u64> {
        let tail = self.stored_end();
        if page >= tail {
            return (page < self.capacity).then_some(page);
        }
        let w = (page / 64) as usize;
        let here = self.words[w] & (u64::MAX << (page % 64));
        if here != 0 {
            return Some(w as u64 * 64 + u64::from(here.trailing_zeros()));
        }
        // The next word with a free page, by the summary.
        let next = w + 1;
        let mut s = next / 64;
        let mut open = match self.open.get(s) {
            Some(&bits) if next % 64 != 0 => bits & (u64::MAX << (next % 64)),
            Some(&bits) => bits,
            None => 0,
        };
        loop {
            if open != 0 {
                let w = s * 64 + open.trailing_zeros() as usize;
                return Some(w as u64 * 64 + u64::from(self.words[w].trailing_zeros()));
            }
            s += 1;
            match self.open.get(s) {
                Some(&bits) => open = bits,
                None => return (tail < self.capacity).then_some(tail),
            }
        }
    }

    /// The maximal free run that starts at the lowest free page at or after
    /// `page`.
    fn run_from(&self, page: u64) -> Option<Extent> {
        let start = self.free_from(page)?;
        let tail = self.stored_end();
        let mut end = start;
        while end < tail {
            let w = (end / 64) as usize;
            let ones = u64::from((self.words[w] >> (end % 64)).trailing_ones());
            end += ones;
            if end % 64 != 0 || ones == 0 {
                return Some(Extent::new(start, end.min(tail) - start));
            }
        }
        Some(Extent::new(start, self.capacity - start))
    }

    /// The free extents in address order.
    fn runs(&self) -> impl Iterator<Item = Extent> + '_ {
        let mut from = 0;
        std::iter::from_fn(move || {
            let run = self.run_from(from)?;
            from = run.end();
            Some(run)
        })
    }
}

/// The word holding `page` and the mask of its bits from `page` up to `end`
/// (exclusive) or the word's end.
#[inline]
fn word_mask(page: u64, end: u64) -> (usize, u64) {
    let bit = page % 64;
    (
        (page / 64) as usize,
        bit_mask(bit, (64 - bit).min(end - page)),
    )
}

/// `len` (1..=64) set bits from bit `low`.
#[inline]
fn bit_mask(low: u64, len: u64) -> u64 {
    if len == 64 {
        u64::MAX
    } else {
        ((1u64 << len) - 1) << low
    }
}

/// The lowest `n` set bits of `word` (which has more than `n`).
#[inline]
fn lowest_set_bits(word: u64, n: u64) -> u64 {
    let mut rest = word;
    for _ in 0..n {
        rest &= rest - 1;
    }
    word & !rest
}

/// Bit `i` set where bits `i .. i + len` of `word` are all set (`len` in
/// `1..=64`): the word ANDed with itself shifted, the run length doubling
/// each step.
#[inline]
fn run_starts(word: u64, len: u64) -> u64 {
    let (mut starts, mut have) = (word, 1);
    while have < len {
        let shift = have.min(len - have);
        starts &= starts >> shift;
        have += shift;
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken_all(bits: &mut FreeBits) {
        let mut taken = ExtentVec::default();
        bits.take_prefix(bits.free_pages(), &mut taken);
    }

    #[test]
    fn take_and_give_back_coalesce() {
        let mut list = FreeBits::new(100);
        assert_eq!(list.take_first_fit(10), Some(Extent::new(0, 10)));
        assert_eq!(list.extents(), vec![Extent::new(10, 90)]);
        assert_eq!(list.take_first_fit(90), Some(Extent::new(10, 90)));
        assert_eq!(list.extent_count(), 0);
        assert_eq!(list.take_first_fit(1), None);
        list.give_back(Extent::new(50, 10));
        list.give_back(Extent::new(0, 10));
        list.give_back(Extent::new(30, 10));
        assert_eq!(
            list.extents(),
            vec![Extent::new(0, 10), Extent::new(30, 10), Extent::new(50, 10)]
        );
        list.give_back(Extent::new(40, 10));
        assert_eq!(
            list.extents(),
            vec![Extent::new(0, 10), Extent::new(30, 30)]
        );
        list.give_back(Extent::new(10, 20));
        list.give_back(Extent::new(60, 40));
        assert_eq!(list.extents(), vec![Extent::new(0, 100)]);
        list.check_structure().unwrap();
    }

    #[test]
    fn first_fit_is_lowest_addressed_that_holds() {
        let free = [(0, 2), (10, 5), (20, 3), (30, 8), (50, 5)].map(|(s, l)| Extent::new(s, l));
        let mut list = FreeBits::from_extents(60, &free);
        list.check_structure().unwrap();
        assert_eq!(list.extents(), free);
        assert_eq!(list.take_first_fit(9), None);
        assert_eq!(list.take_first_fit(6), Some(Extent::new(30, 6)));
        assert_eq!(list.take_first_fit(3), Some(Extent::new(10, 3)));
        assert_eq!(list.take_first_fit(1), Some(Extent::new(0, 1)));
        assert_eq!(list.largest(), 5);
        let mut taken = ExtentVec::default();
        list.take_prefix(6, &mut taken);
        assert_eq!(
            taken.as_slice(),
            vec![Extent::new(1, 1), Extent::new(13, 2), Extent::new(20, 3)]
        );
        assert_eq!(list.extents(), vec![Extent::new(36, 2), Extent::new(50, 5)]);
        assert_eq!(list.free_pages(), 7);
        list.check_structure().unwrap();
    }

    #[test]
    fn runs_cross_words_and_reach_into_the_unstored_tail() {
        let mut list = FreeBits::new(1_000);
        taken_all(&mut list);
        // Free: 60..200 (three words), 300..301, 990..1000 (the last word).
        for (start, len) in [(60, 140), (300, 1), (990, 10)] {
            list.give_back(Extent::new(start, len));
        }
        list.check_structure().unwrap();
        assert_eq!(list.take_first_fit(141), None);
        assert_eq!(list.take_first_fit(100), Some(Extent::new(60, 100)));
        assert_eq!(list.take_first_fit(40), Some(Extent::new(160, 40)));
        assert_eq!(list.take_first_fit(2), Some(Extent::new(990, 2)));
        assert_eq!(
            list.extents(),
            vec![Extent::new(300, 1), Extent::new(992, 8)]
        );
        // A pool never filled stores only the words it has handed out.
        let mut big = FreeBits::new(1 << 32);
        assert_eq!(big.take_first_fit(70), Some(Extent::new(0, 70)));
        assert_eq!(big.words.len(), 2);
        assert_eq!(big.take_first_fit(1 << 31), Some(Extent::new(70, 1 << 31)));
        big.give_back(Extent::new(0, 70));
        assert_eq!(
            big.extents(),
            vec![
                Extent::new(0, 70),
                Extent::new(70 + (1 << 31), (1 << 31) - 70)
            ]
        );
        assert_eq!(
            big.take_first_fit(80),
            Some(Extent::new(70 + (1 << 31), 80))
        );
        big.check_structure().unwrap();
    }

    #[test]
    fn a_restored_pool_stores_up_to_its_free_tail() {
        let free = [Extent::new(3, 4), Extent::new(200, 1 << 30)];
        let list = FreeBits::from_extents(200 + (1 << 30), &free);
        assert_eq!(list.words.len(), 4);
        assert_eq!(list.extents(), free);
        list.check_structure().unwrap();
        let none = FreeBits::from_extents(130, &[]);
        assert_eq!((none.free_pages(), none.extents()), (0, vec![]));
        none.check_structure().unwrap();
    }

    #[test]
    fn run_starts_marks_every_fitting_start() {
        assert_eq!(run_starts(0b1110_1111, 3), 0b0010_0011);
        assert_eq!(run_starts(u64::MAX, 64), 1);
        assert_eq!(run_starts(u64::MAX >> 1, 64), 0);
        assert_eq!(run_starts(0b1011, 1), 0b1011);
    }
}

#[cfg(test)]
#[path = "free_bits_model.rs"]
mod model;
