//! Where a page's bytes are: in an engine's host pool and in the slab.
//!
//! Host side: a pool's CPU buffers (`Region`s) and, for the pool classes the
//! adapter models, a layout table ([`Entry`] per entry of a page: each entry
//! of the page whose first host index is `first` lies at `offset + (first /
//! divisor) * stride` of buffer `buffer`, `bytes` long); for any other class,
//! the engine's own addresses. [`HostPages`] is one call's pages, every entry
//! checked to lie inside its buffer before anything is stored or copied.
//!
//! Slab side ([`PageLayout`]): `rows` rows of `page_bytes` (one page each),
//! stored entry by entry: entry `j` of every row, then entry `j + 1` of every
//! row, so the entries of consecutive rows lie back to back, as they do in a
//! host buffer, and a batch copies in runs rather than page pieces. Next to
//! the data, the rows' stamps and tags ([`RowStamps`]). A page laid out whole
//! (an L3 record's payload, a tensor call's value) holds its entries in order.

use crate::region::Region;
use crate::seqlock::RowStamps;

/// Where one entry of a page lies in the host pool, by the pool's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub buffer: usize,
    pub offset: u64,
    pub stride: u64,
    pub divisor: u64,
    pub bytes: u64,
}

impl Entry {
    /// Entry `j` of a layout table row `(buffer, offset, stride, divisor,
    /// bytes)` over `buffers` buffers, checked.
    pub fn checked(j: usize, row: [i64; 5], buffers: usize) -> Result<Self, String> {
        let [buffer, offset, stride, divisor, bytes] = row;
        if buffer < 0
            || buffer as usize >= buffers
            || offset < 0
            || stride < 0
            || divisor < 1
            || bytes < 1
        {
            return Err(format!(
                "entry {j}: (buffer {buffer}, offset {offset}, stride {stride}, divisor {divisor}, bytes {bytes}) \
                 is not an entry of {buffers} buffers"
            ));
        }
        Ok(Entry {
            buffer: buffer as usize,
            offset: offset as u64,
            stride: stride as u64,
            divisor: divisor as u64,
            bytes: bytes as u64,
        })
    }
}

/// A page entry outside the pool's buffers: page, entry, and where it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outside {
    pub page: usize,
    pub entry: usize,
    pub at: String,
}

/// One call's pages in the host pool, page after page: (buffer, byte offset)
/// of each entry, each checked to lie inside its buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPages {
    entries: usize,
    at: Vec<(usize, u64)>,
}

impl HostPages {
    /// The pages whose first host indices are `firsts`, by the layout table.
    pub fn from_layout(table: &[Entry], host: &[Region], firsts: &[i64]) -> Result<Self, Outside> {
        let mut at = Vec::with_capacity(firsts.len() * table.len());
        for (page, &first) in firsts.iter().enumerate() {
            for (j, e) in table.iter().enumerate() {
                let unit = (first.max(0) as u64) / e.divisor;
                match unit
                    .checked_mul(e.stride)
                    .and_then(|o| o.checked_add(e.offset))
                {
                    Some(offset) if host[e.buffer].holds(offset, e.bytes) => {
                        at.push((e.buffer, offset));
                    }
                    _ => {
                        return Err(Outside {
                            page,
                            entry: j,
                            at: format!(
                                "buffer {} + {unit} * {} + {} bytes",
                                e.buffer, e.stride, e.bytes
                            ),
                        })
                    }
                }
            }
        }
        Ok(HostPages {
            entries: table.len(),
            at,
        })
    }

    /// The pages whose entries the engine placed at `addresses[k]`, `lens[k]`
    /// bytes each (entry `k % sizes.len()` of page `k / sizes.len()`): each
    /// must have its entry's size and lie inside one of the buffers.
    pub fn from_addresses(
        sizes: &[u64],
        host: &[Region],
        addresses: &[u64],
        lens: &[u64],
    ) -> Result<Self, Outside> {
        let per = sizes.len();
        let mut at = Vec::with_capacity(addresses.len());
        for (k, (&address, &len)) in addresses.iter().zip(lens).enumerate() {
            let (page, j) = (k / per, k % per);
            let found = host.iter().enumerate().find_map(|(b, r)| {
                let offset = address.checked_sub(r.address() as u64)?;
                (len == sizes[j] && r.holds(offset, len)).then_some((b, offset))
            });
            at.push(found.ok_or_else(|| Outside {
                page,
                entry: j,
                at: format!("{address:#x} + {len} bytes"),
            })?);
        }
        Ok(HostPages { entries: per, at })
    }

    /// No pages, of `entries` entries each.
    pub fn empty(entries: usize) -> Self {
        HostPages {
            entries,
            at: Vec::new(),
        }
    }

    /// (buffer, byte offset) of each entry of `page`.
    pub fn page(&self, page: usize) -> &[(usize, u64)] {
        &self.at[page * self.entries..(page + 1) * self.entries]
    }

    /// The host address of every entry of every page, page after page.
    pub fn addresses(&self, host: &[Region]) -> Vec<u64> {
        self.at
            .iter()
            .map(|&(b, at)| host[b].address() as u64 + at)
            .collect()
    }
}

/// A slab region's geometry: its entries' sizes, where each lies in a row
/// and in a page laid out whole, and how many rows it holds.
#[derive(Clone, Debug)]
pub struct PageLayout {
    name: String,
    sizes: Vec<u64>,
    /// Where entry `j` starts in a page laid out whole: the sizes before it.
    page_offsets: Vec<u64>,
    /// Where entry `j` of every row starts in the slab's data: row `r`'s
    /// entry `j` is at `entry_bases[j] + r * sizes[j]`.
    entry_bases: Vec<u64>,
    page_bytes: u64,
    rows: u64,
}

/// The memory a pool copies between, while it is open.
#[derive(Clone, Debug)]
pub struct PoolMemory {
    pub(crate) host: Vec<Region>,
    pub(crate) data: Region,
    pub(crate) stamps: RowStamps,
}

impl PoolMemory {
    pub fn host(&self) -> &[Region] {
        &self.host
    }

    pub fn stamps(&self) -> &RowStamps {
        &self.stamps
    }
}

impl PageLayout {
    /// The slab of pool `name` (entries of `sizes` bytes) over `data` (its
    /// rows), `stamps` and `tags` (an aligned int64 per row), copying to and
    /// from the host buffers `host` (none of which may overlap the slab).
    pub fn open(
        name: &str,
        sizes: Vec<u64>,
        host: Vec<Region>,
        data: Region,
        stamps: Region,
        tags: Region,
    ) -> Result<(Self, PoolMemory), String> {
        if sizes.is_empty() || sizes.contains(&0) {
            return Err(format!(
                "pool '{name}': entry sizes must be >= 1 and at least one, got {sizes:?}"
            ));
        }
        let mut page_offsets = Vec::with_capacity(sizes.len());
        let mut page_bytes = 0u64;
        for &s in &sizes {
            page_offsets.push(page_bytes);
            page_bytes = page_bytes
                .checked_add(s)
                .ok_or_else(|| format!("pool '{name}': a page's size overflows"))?;
        }
        let rows = (data.len() as u64) / page_bytes;
        let row_stamps = RowStamps::new(stamps, tags, rows)
            .ok()
            .filter(|_| data.len() as u64 == rows * page_bytes)
            .ok_or_else(|| {
                format!(
                    "pool '{name}': the slab's data ({} bytes), stamps ({} bytes) and tags ({} bytes) are not \
                     {rows} rows of {page_bytes} bytes and two aligned int64 each",
                    data.len(),
                    stamps.len(),
                    tags.len()
                )
            })?;
        // Bounded by the data's bytes (checked above): no overflow.
        let entry_bases = sizes
            .iter()
            .scan(0u64, |at, &s| {
                let base = *at;
                *at += rows * s;
                Some(base)
            })
            .collect();
        for (i, h) in host.iter().enumerate() {
            for (what, r) in [("data", &data), ("stamps", &stamps), ("tags", &tags)] {
                if h.overlaps(r) {
                    return Err(format!(
                        "pool '{name}': host buffer {i} overlaps the slab's {what}"
                    ));
                }
            }
        }
        let layout = PageLayout {
            name: name.to_string(),
            sizes,
            page_offsets,
            entry_bases,
            page_bytes,
            rows,
        };
        let memory = PoolMemory {
            host,
            data,
            stamps: row_stamps,
        };
        Ok((layout, memory))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Each entry's size in bytes.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Where entry `j` starts in a page laid out whole.
    pub(crate) fn page_offset(&self, j: usize) -> u64 {
        self.page_offsets[j]
    }

    /// Entry `j` of every row: (where it starts in the data, its bytes).
    pub(crate) fn entry_span(&self, j: usize) -> (u64, u64) {
        (self.entry_bases[j], self.rows * self.sizes[j])
    }
}
