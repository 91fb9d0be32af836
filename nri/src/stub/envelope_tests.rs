use protobuf::Message;
use ttrpc::proto::KeyValue;
use ttrpc::{Code, Request, Response};

use super::*;
use crate::api;
use crate::protowire::WireError;

fn request(service: &str, method: &str, payload: &[u8], timeout_nano: i64) -> Request {
    Request {
        service: service.into(),
        method: method.into(),
        payload: payload.to_vec(),
        timeout_nano,
        ..Default::default()
    }
}

#[test]
fn reads_what_the_generated_request_writes() {
    let big: Vec<u8> = (0..5000).map(|i| i as u8).collect();
    let mut with_metadata = request("s", "m", b"p", 1);
    with_metadata.metadata.push(KeyValue {
        key: "k".into(),
        value: "v".into(),
        ..Default::default()
    });
    let cases = [
        request(
            "nri.pkg.api.v1alpha1.Plugin",
            "CreateContainer",
            &big,
            2_000_000_000,
        ),
        request("", "", b"", 0),
        request("a", "b", b"", -1),
        request("a", "b", b"x", i64::MAX),
        request("a", "b", b"x", i64::MIN),
        with_metadata,
    ];
    for req in cases {
        let bytes = req.write_to_bytes().unwrap();
        let view = RequestView::decode(&bytes).unwrap();
        assert_eq!(view.service, req.service);
        assert_eq!(view.method, req.method);
        assert_eq!(view.payload, req.payload.as_slice());
        assert_eq!(view.timeout_nano, req.timeout_nano);
    }
}

#[test]
fn skips_unknown_fields_and_keeps_the_last_of_a_repeated_one() {
    let mut bytes = request("a", "first", b"p", 5).write_to_bytes().unwrap();
    // field 9 varint, field 10 fixed64, field 11 bytes, field 12 fixed32
    bytes.extend_from_slice(&[9 << 3, 0x96, 0x01]);
    bytes.extend_from_slice(&[10 << 3 | 1, 1, 2, 3, 4, 5, 6, 7, 8]);
    bytes.extend_from_slice(&[11 << 3 | 2, 2, b'x', b'y']);
    bytes.extend_from_slice(&[12 << 3 | 5, 1, 2, 3, 4]);
    bytes.extend_from_slice(&[2 << 3 | 2, 4, b'l', b'a', b's', b't']);
    let view = RequestView::decode(&bytes).unwrap();
    assert_eq!(
        view,
        RequestView {
            service: "a",
            method: "last",
            payload: b"p",
            timeout_nano: 5
        }
    );
}

/// `key`, then the 11-byte varint `0xff` × 10, `0x01`: longer than any u64.
fn overlong_varint_after(key: u8) -> Vec<u8> {
    let mut bytes = vec![key];
    bytes.extend([0xff; 10]);
    bytes.push(0x01);
    bytes
}

#[test]
fn refuses_malformed_envelopes() {
    let cases: [(Vec<u8>, WireError); 11] = [
        (vec![1 << 3 | 2, 5, b'a'], WireError::Truncated { at: 2 }),
        (vec![1 << 3 | 2], WireError::Truncated { at: 1 }),
        (vec![4 << 3, 0x80], WireError::Truncated { at: 2 }),
        (
            overlong_varint_after(4 << 3),
            WireError::VarintTooLong { at: 1 },
        ),
        (vec![7 << 3 | 3], WireError::Group { field: 7, at: 1 }),
        (vec![2 << 3 | 2, 1, 0xff], WireError::NotUtf8 { field: 2 }),
        // Ten bytes whose last carries more than the 64th bit overflow u64.
        (
            [vec![4 << 3], vec![0xff; 9], vec![0x02]].concat(),
            WireError::VarintTooLong { at: 1 },
        ),
        // Field 0 is no field, in a key of its own or after a good one (key 2:
        // field 0, wire type 2).
        (vec![0], WireError::FieldNumber { field: 0, at: 0 }),
        (
            vec![4 << 3, 1, 2, 0],
            WireError::FieldNumber { field: 0, at: 2 },
        ),
        // Past the largest field number, also as a field that is skipped:
        // keys 2^33 (field 2^30) and 2^32 (field 2^29, one past the largest).
        (
            vec![0x80, 0x80, 0x80, 0x80, 0x20, 0],
            WireError::FieldNumber {
                field: 1 << 30,
                at: 0,
            },
        ),
        (
            vec![2 << 3 | 2, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 7],
            WireError::FieldNumber {
                field: 1 << 29,
                at: 2,
            },
        ),
    ];
    for (bytes, want) in cases {
        assert_eq!(RequestView::decode(&bytes), Err(want), "{bytes:?}");
    }
    // The largest field number, 2^29 - 1 (key 2^32 - 8), is a field to skip.
    assert!(RequestView::decode(&[0xf8, 0xff, 0xff, 0xff, 0x0f, 7]).is_ok());
    // A length that does not fit in memory is truncation, not an overflow:
    // the payload's length, 0xff × 9 then 0x01, is 2^64 - 1.
    let mut huge = overlong_varint_after(3 << 3 | 2);
    huge.remove(1);
    assert!(matches!(
        RequestView::decode(&huge),
        Err(WireError::Truncated { .. })
    ));
}

#[test]
fn every_prefix_of_a_request_decodes_or_fails_without_panicking() {
    let bytes = request("svc", "method", &[7; 300], 42)
        .write_to_bytes()
        .unwrap();
    let whole = RequestView::decode(&bytes).unwrap();
    assert_eq!(
        (
            whole.service,
            whole.method,
            whole.payload.len(),
            whole.timeout_nano
        ),
        ("svc", "method", 300, 42)
    );
    // A prefix ends at a field's boundary, and reads as the fields before it
    // (each as sent, or absent), or inside one, and is truncated.
    for end in 0..bytes.len() {
        match RequestView::decode(&bytes[..end]) {
            Ok(view) => {
                assert!(view.service.is_empty() || view.service == "svc", "{end}");
                assert!(view.method.is_empty() || view.method == "method", "{end}");
                assert!(
                    view.payload.is_empty() || view.payload.len() == 300,
                    "{end}"
                );
            }
            Err(e) => assert!(matches!(e, WireError::Truncated { .. }), "{end}: {e}"),
        }
    }
}

#[test]
fn ok_replies_are_the_bytes_of_the_generated_response() {
    let mut big = api::CreateContainerResponse::default();
    big.adjust.mut_or_insert_default().annotations =
        (0..200).map(|i| (format!("k{i}"), "v".repeat(i))).collect();
    same_as_generated(&api::Empty::default());
    same_as_generated(&api::ConfigureResponse {
        events: 7,
        ..Default::default()
    });
    same_as_generated(&big);
    // Replies encoded before: the same bytes, whatever the length's varint
    // width (1, 2 and 3 bytes).
    for n in [None, Some(0), Some(3), Some(20), Some(200)] {
        let mut reply = api::CreateContainerResponse::default();
        if let Some(n) = n {
            reply.adjust.mut_or_insert_default().annotations =
                (0..n).map(|i| (format!("k{i}"), "v".repeat(i))).collect();
        }
        let encoded = crate::stub::EncodedReply::new(&reply).unwrap();
        let mut out = vec![0xee];
        encode_ok_bytes(&mut out, encoded.as_bytes());
        assert_eq!(out, generated(&reply, vec![0xee]), "{n:?} annotations");
    }
}

/// The generated `Response` with an OK status and `reply`, after `prefix`.
fn generated<M: Message>(reply: &M, mut prefix: Vec<u8>) -> Vec<u8> {
    let resp = Response {
        status: Some(ttrpc::get_status(Code::OK, "")).into(),
        payload: reply.write_to_bytes().unwrap(),
        ..Default::default()
    };
    resp.write_to_vec(&mut prefix).unwrap();
    prefix
}

fn same_as_generated<M: Message>(reply: &M) {
    let mut out = vec![0xee];
    encode_ok(&mut out, reply).unwrap();
    let want = Response {
        status: Some(ttrpc::get_status(Code::OK, "")).into(),
        payload: reply.write_to_bytes().unwrap(),
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap();
    assert_eq!(out[0], 0xee, "appends, keeps what was there");
    assert_eq!(&out[1..], want.as_slice());
}

#[test]
fn error_replies_carry_the_status() {
    let mut out = Vec::new();
    encode_status(&mut out, ttrpc::get_status(Code::NOT_FOUND, "gone"));
    let resp = Response::parse_from_bytes(&out).unwrap();
    assert_eq!(resp.status.code(), Code::NOT_FOUND);
    assert_eq!(resp.status.message(), "gone");
    assert!(resp.payload.is_empty());
}
