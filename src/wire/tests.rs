use super::*;

fn request(d: &mut Decoder, buf: &[u8]) -> Request {
    match d.next(buf) {
        Next::Request(r) => r,
        other => panic!("{other:?}"),
    }
}

#[test]
fn each_transport_is_detected_from_its_first_bytes() {
    let call = crate::rpc::mangle::seeds().remove(0);
    // Unframed, two pipelined.
    let mut d = Decoder::new(1 << 20);
    let mut two = call.clone();
    two.extend_from_slice(&call);
    let r = request(&mut d, &two);
    assert_eq!(
        (r.consumed, r.envelope.clone()),
        (call.len(), Envelope::Unframed)
    );
    assert_eq!(request(&mut d, &two[r.consumed..]).consumed, call.len());
    // Framed.
    let framed = Envelope::Framed.wrap(&call);
    let mut d = Decoder::new(1 << 20);
    for end in 0..framed.len() {
        assert!(matches!(d.next(&framed[..end]), Next::Need), "{end}");
    }
    let r = request(&mut d, &framed);
    assert_eq!(r.message.bytes(&framed), &call[..]);
    // THeader, then a framed frame on the same connection.
    let h = header::Reply {
        seq_id: 9,
        flags: 0,
        proto: Protocol::Binary,
        zlib: true,
    };
    let mut both = header::frame(&h, &call);
    both.extend_from_slice(&framed);
    let mut d = Decoder::new(1 << 20);
    let r = request(&mut d, &both);
    assert_eq!(
        (r.message.bytes(&both), r.envelope),
        (&call[..], Envelope::Header(h))
    );
    assert_eq!(
        request(&mut d, &both[r.consumed..]).envelope,
        Envelope::Framed
    );
    // HTTP.
    let mut post = format!(
        "POST / HTTP/1.1\r\nContent-Type: application/x-thrift\r\nContent-Length: {}\r\n\r\n",
        call.len()
    )
    .into_bytes();
    post.extend_from_slice(&call);
    let mut d = Decoder::new(1 << 20);
    let r = request(&mut d, &post);
    assert_eq!(r.message.bytes(&post), &call[..]);
    assert_eq!(r.envelope.transport(), Transport::Http);
    // Garbage.
    for junk in [
        &b"\xff\xff\xff\xff"[..],
        b"GIT / HTTP/1.1\r\n\r\n",
        b"\x00\x00\x00\x05\x10",
    ] {
        assert!(matches!(
            Decoder::new(100).next(junk),
            Next::Close {
                reason: "unknown_transport",
                ..
            }
        ));
    }
    // A GET is told that only POST carries Thrift.
    let Next::Close {
        answer: Some(a), ..
    } = Decoder::new(100).next(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    else {
        panic!("a GET gets an answer");
    };
    assert!(a.starts_with(b"HTTP/1.1 405 "));
}

#[test]
fn every_kind_is_bounded() {
    let mut d = Decoder::new(100);
    assert!(matches!(
        d.next(&1000u32.to_be_bytes()),
        Next::Close {
            reason: "too_large",
            ..
        }
    ));
    let mut d = Decoder::new(100);
    let mut unframed = vec![0x80, 0x01, 0x00, 0x01, 0, 0, 0, 200];
    unframed.resize(101, b'x');
    assert!(matches!(
        d.next(&unframed),
        Next::Close {
            reason: "too_large",
            ..
        }
    ));
    let mut d = Decoder::new(100);
    let post =
        b"POST / HTTP/1.1\r\nContent-Type: application/x-thrift\r\nContent-Length: 101\r\n\r\n";
    let Next::Close {
        answer: Some(a), ..
    } = d.next(post)
    else {
        panic!("an HTTP body over the limit gets a 413");
    };
    assert!(a.starts_with(b"HTTP/1.1 413 "));
    // A whole unframed message over the limit, arriving at once.
    let call = crate::rpc::mangle::seeds().remove(0);
    let mut d = Decoder::new(call.len() - 1);
    assert!(matches!(
        d.next(&call),
        Next::Close {
            reason: "too_large",
            ..
        }
    ));
    // An HTTP head over its limit, arriving whole in one read.
    let mut head = b"POST / HTTP/1.1\r\nX-Pad: ".to_vec();
    head.resize(http::HEAD_BYTES_MAX + 10, b'p');
    head.extend_from_slice(b"\r\n\r\n");
    let Next::Close {
        answer: Some(a), ..
    } = Decoder::new(1 << 20).next(&head)
    else {
        panic!("a head over the limit gets a 431");
    };
    assert!(a.starts_with(b"HTTP/1.1 431 "));
}

/// A reply's message is the body of its framing as it is, not copied behind it (a full
/// dequeue reply is up to `server.reply_bytes_max`); zlib alone makes a new body.
#[test]
fn a_reply_is_framed_without_copying_its_message() {
    let msg = vec![9u8; 1 << 20];
    let plain = header::Reply {
        seq_id: 3,
        flags: 0,
        proto: Protocol::Binary,
        zlib: false,
    };
    let http = http::Reply {
        content_type: "application/x-thrift",
        keep_alive: true,
    };
    for envelope in [
        Envelope::Framed,
        Envelope::Unframed,
        Envelope::Header(plain),
        Envelope::Http(http),
    ] {
        let owned = msg.clone();
        let at = owned.as_ptr();
        let w = envelope.wrap_owned(owned);
        assert_eq!(w.body.as_ptr(), at, "{envelope:?}: the body was copied");
        assert!(w.head.len() < 128);
        assert_eq!(w.into_vec(), envelope.wrap(&msg));
    }
}
