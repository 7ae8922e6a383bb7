//! Records by the batch (`cpkv_tier::l3::batch`): what one call seals, the
//! checks read back in each shape, and a refused call writes nothing.

use cpkv_tier::l3::{
    check_into, check_packed, check_split, encode_log_entry, encode_log_header, record_bytes,
    recover_logs, seal_packed, seal_records, seal_tails, L3Error, LogEntry, LogHeader, RecordBatch,
    RecordReject, HEADER_BYTES,
};

const NS: u64 = 0x5eed;
const LENGTH: usize = 100;

fn payloads(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|j| (0..LENGTH).map(|i| (i * 7 + j * 31) as u8).collect())
        .collect()
}

fn batch<'a>(keys: &'a [u64], sequences: &'a [u64]) -> RecordBatch<'a> {
    RecordBatch {
        namespace: NS,
        keys,
        sequences,
        length: LENGTH as u64,
    }
}

#[test]
fn sealed_records_check_into_their_rows_and_a_flipped_byte_is_named() {
    let (keys, sequences) = ([11u64, 12, 13], [1u64, 2, 3]);
    let data = payloads(3);
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let each = record_bytes(LENGTH as u64) as usize;
    let mut records = vec![0xa5u8; 3 * each];
    seal_records(&mut records, &batch(&keys, &sequences), &refs).unwrap();
    records[2 * each + 5] ^= 1; // record 2's payload
    let mut out = vec![0u8; 4 * LENGTH];
    let reasons = check_into(
        &records,
        each,
        &batch(&keys, &sequences),
        &mut out,
        &[3, 0, 1],
    )
    .unwrap();
    assert!(reasons[0].is_none() && reasons[1].is_none());
    assert!(matches!(reasons[2], Some(RecordReject::Checksum { .. })));
    assert_eq!(&out[3 * LENGTH..], &data[0][..]);
    assert_eq!(&out[..LENGTH], &data[1][..]);
    assert!(
        out[LENGTH..2 * LENGTH].iter().all(|&b| b == 0),
        "a bad record is not copied"
    );
    // A record asked for under another sequence is stale.
    let stale = check_into(
        &records,
        each,
        &batch(&keys, &[9, 2, 3]),
        &mut out,
        &[3, 0, 1],
    )
    .unwrap();
    assert!(matches!(
        stale[0],
        Some(RecordReject::StaleSequence { found: 1 })
    ));
}

#[test]
fn tails_sealed_apart_check_split_against_payloads_in_their_rows() {
    let (keys, sequences) = ([5u64, 6], [7u64, 8]);
    let data = payloads(2);
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let tail = record_bytes(LENGTH as u64) as usize - LENGTH;
    let mut tails = vec![0xffu8; 2 * tail];
    seal_tails(&mut tails, &batch(&keys, &sequences), &refs).unwrap();
    let out: Vec<u8> = [&data[1][..], &data[0][..]].concat();
    let b = batch(&keys, &sequences);
    let reasons = check_split(&tails, &out, &[1, 0], &[true, false], &b).unwrap();
    assert!(reasons[0].is_none());
    assert_eq!(reasons[1].map(|r| r.name()), Some("truncated"));
    let swapped = check_split(&tails, &out, &[0, 1], &[true, true], &b).unwrap();
    assert!(swapped
        .iter()
        .all(|r| matches!(r, Some(RecordReject::Checksum { .. }))));
}

#[test]
fn packed_records_seal_in_place_and_check() {
    let (keys, sequences) = ([1u64, 2], [3u64, 4]);
    let each = LENGTH + HEADER_BYTES;
    let mut records = vec![0u8; 2 * each];
    for (j, p) in payloads(2).iter().enumerate() {
        records[j * each..j * each + LENGTH].copy_from_slice(p);
    }
    seal_packed(&mut records, &batch(&keys, &sequences)).unwrap();
    assert!(check_packed(&records, &batch(&keys, &sequences))
        .unwrap()
        .iter()
        .all(Option::is_none));
    let wrong = check_packed(&records, &batch(&[2, 1], &sequences)).unwrap();
    assert!(wrong
        .iter()
        .all(|r| matches!(r, Some(RecordReject::WrongKey { .. }))));
}

#[test]
fn a_refused_batch_names_why_and_writes_nothing() {
    let (keys, sequences) = ([1u64, 2], [3u64, 4]);
    let data = payloads(2);
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let each = record_bytes(LENGTH as u64) as usize;
    let reason = |e: L3Error| e.to_string();

    let mut records = vec![7u8; 2 * each - 1];
    let err = seal_records(&mut records, &batch(&keys, &sequences), &refs).unwrap_err();
    assert!(reason(err).contains("records holds"), "short buffer");
    assert!(records.iter().all(|&b| b == 7));

    let mut records = vec![7u8; 2 * each];
    let err = seal_records(&mut records, &batch(&keys, &sequences[..1]), &refs).unwrap_err();
    assert!(reason(err).contains("differ in length"));
    let short = [&data[0][..], &data[1][..LENGTH - 1]];
    let err = seal_records(&mut records, &batch(&keys, &sequences), &short).unwrap_err();
    assert!(reason(err).contains("payload 1 has 99 bytes"));
    assert!(records.iter().all(|&b| b == 7));

    let mut out = vec![9u8; 2 * LENGTH];
    let err = check_into(&records, each, &batch(&keys, &sequences), &mut out, &[0, 2]).unwrap_err();
    assert!(reason(err).contains("row 2 is outside out"));
    let err = check_into(
        &records,
        each,
        &batch(&keys, &sequences),
        &mut out,
        &[0, u64::MAX],
    )
    .unwrap_err();
    assert!(
        reason(err).contains("is outside out"),
        "no overflow on a huge row"
    );
    let err = check_into(
        &records,
        LENGTH,
        &batch(&keys, &sequences),
        &mut out,
        &[0, 1],
    )
    .unwrap_err();
    assert!(reason(err).contains("does not fit a record buffer"));
    assert!(out.iter().all(|&b| b == 9));

    let mut packed = vec![0u8; 2 * (LENGTH + HEADER_BYTES) + 1];
    assert!(seal_packed(&mut packed, &batch(&keys, &sequences)).is_err());
    assert!(packed.iter().all(|&b| b == 0));
}

#[test]
fn recovery_reads_the_logs_of_its_namespace_and_ignores_the_rest() {
    let want = LogHeader {
        namespace: NS,
        slot_bytes: 8192,
        slots: 4,
    };
    let log = |header: &LogHeader, entries: &[LogEntry]| {
        let mut bytes = encode_log_header(header).to_vec();
        for e in entries {
            bytes.extend_from_slice(&encode_log_entry(e));
        }
        bytes
    };
    let entry = |key, sequence, slot| LogEntry {
        key,
        sequence,
        slot,
        length: 10,
    };
    let foreign = LogHeader {
        namespace: NS + 1,
        ..want
    };
    let ours = log(&want, &[entry(1, 1, 0), entry(2, 2, 1)]);
    let logs = vec![ours.clone(), log(&foreign, &[entry(3, 3, 2)]), Vec::new()];
    let recovered = recover_logs(1, &logs, &want).unwrap();
    assert_eq!(recovered.valid, vec![ours.len(), 0, 0]);
    assert_eq!(recovered.foreign_logs, 1, "the empty log is not foreign");
    assert_eq!(recovered.report.kept, 2);
    assert_eq!(recovered.index.peek(1), Some((0, 1)));
    assert_eq!(recovered.index.peek(3), None);
}
