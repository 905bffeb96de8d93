//! The Thrift edge under abuse: frame limits, garbage input, unknown methods,
//! undecodable arguments and hostile lengths. Each bad frame either gets a
//! TApplicationException on a connection that keeps working, or closes only its own
//! connection; the server keeps serving.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use foqs::thrift_gen::{FoqsGetHostInfoArgs, FoqsGetHostInfoResult};
use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TCompactInputProtocol, TCompactOutputProtocol,
    TFieldIdentifier, TInputProtocol, TListIdentifier, TMessageIdentifier, TMessageType,
    TOutputProtocol, TStructIdentifier, TType,
};
use thrift::ApplicationErrorKind;

const MAX_FRAME: usize = 64 * 1024;

async fn server() -> TestServer {
    TestServer::start_full(
        TestDb::new(3),
        &format!("max_frame_bytes = {MAX_FRAME}"),
        "",
    )
    .await
}

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn send_frame(s: &mut TcpStream, msg: &[u8]) {
    let mut f = (msg.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(msg);
    s.write_all(&f).unwrap();
}

fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut msg = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut msg).unwrap();
    msg
}

/// True when the server closed the connection (EOF or reset), within the read timeout.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// A binary-protocol call message whose arguments `body` writes.
fn binary_call(name: &str, body: impl FnOnce(&mut dyn TOutputProtocol)) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut o = TBinaryOutputProtocol::new(&mut out, true);
        o.write_message_begin(&TMessageIdentifier::new(name, TMessageType::Call, 7))
            .unwrap();
        o.write_struct_begin(&TStructIdentifier::new("args"))
            .unwrap();
        body(&mut o);
        o.write_field_stop().unwrap();
        o.write_struct_end().unwrap();
        o.write_message_end().unwrap();
        o.flush().unwrap();
    }
    out
}

fn expect_app_error(reply: &[u8], name: &str, kind: ApplicationErrorKind) -> String {
    let mut i = TBinaryInputProtocol::new(reply, true);
    let ident = i.read_message_begin().unwrap();
    assert_eq!(ident.message_type, TMessageType::Exception);
    assert_eq!(ident.name, name);
    assert_eq!(ident.sequence_number, 7);
    let e = thrift::Error::read_application_error_from_in_protocol(&mut i).unwrap();
    assert_eq!(e.kind, kind, "{}", e.message);
    e.message
}

/// Sends getHostInfo on `s` and checks the reply: the connection still works.
fn still_works(s: &mut TcpStream) {
    let mut out = Vec::new();
    {
        let mut o = TBinaryOutputProtocol::new(&mut out, true);
        o.write_message_begin(&TMessageIdentifier::new(
            "getHostInfo",
            TMessageType::Call,
            8,
        ))
        .unwrap();
        FoqsGetHostInfoArgs {}
            .write_to_out_protocol(&mut o)
            .unwrap();
        o.write_message_end().unwrap();
    }
    send_frame(s, &out);
    let reply = read_frame(s);
    let mut i = TBinaryInputProtocol::new(&reply[..], true);
    let ident = i.read_message_begin().unwrap();
    assert_eq!(
        (ident.message_type, ident.sequence_number),
        (TMessageType::Reply, 8)
    );
    let r = FoqsGetHostInfoResult::read_from_in_protocol(&mut i).unwrap();
    assert_eq!(r.result_value.unwrap().shards.unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_method_gets_unknown_method_and_the_connection_survives() {
    let srv = server().await;
    let mut s = raw(srv.addr);
    send_frame(
        &mut s,
        &binary_call("noSuchMethod", |o| {
            o.write_field_begin(&TFieldIdentifier::new("x", TType::I32, 1))
                .unwrap();
            o.write_i32(5).unwrap();
            o.write_field_end().unwrap();
        }),
    );
    let msg = expect_app_error(
        &read_frame(&mut s),
        "noSuchMethod",
        ApplicationErrorKind::UnknownMethod,
    );
    assert!(msg.contains("noSuchMethod"));
    still_works(&mut s);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_arguments_get_protocol_error_with_a_message() {
    let srv = server().await;
    let mut s = raw(srv.addr);
    // enqueue(req: EnqueueRequest{ items: list<struct> of 0x7fffffff elements }) in a tiny
    // frame: must be refused without allocating for two billion items.
    send_frame(
        &mut s,
        &binary_call("enqueue", |o| {
            o.write_field_begin(&TFieldIdentifier::new("req", TType::Struct, 1))
                .unwrap();
            o.write_struct_begin(&TStructIdentifier::new("EnqueueRequest"))
                .unwrap();
            o.write_field_begin(&TFieldIdentifier::new("items", TType::List, 1))
                .unwrap();
            o.write_list_begin(&TListIdentifier::new(TType::Struct, 0x7fff_ffff))
                .unwrap();
        }),
    );
    let msg = expect_app_error(
        &read_frame(&mut s),
        "enqueue",
        ApplicationErrorKind::ProtocolError,
    );
    assert!(
        msg.to_lowercase().contains("size"),
        "the decoder's message is kept: {msg}"
    );
    still_works(&mut s);

    // A string that is not UTF-8 where the IDL says string.
    send_frame(
        &mut s,
        &binary_call("getActiveTopics", |o| {
            o.write_field_begin(&TFieldIdentifier::new("req", TType::Struct, 1))
                .unwrap();
            o.write_struct_begin(&TStructIdentifier::new("GetActiveTopicsRequest"))
                .unwrap();
            o.write_field_begin(&TFieldIdentifier::new("ns", TType::String, 1))
                .unwrap();
            o.write_bytes(&[0xff, 0xfe, 0x00]).unwrap();
            o.write_field_end().unwrap();
            o.write_field_stop().unwrap();
            o.write_struct_end().unwrap();
            o.write_field_end().unwrap();
        }),
    );
    expect_app_error(
        &read_frame(&mut s),
        "getActiveTopics",
        ApplicationErrorKind::ProtocolError,
    );
    still_works(&mut s);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_negative_and_unframed_input_close_only_that_connection() {
    let srv = server().await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "over the frame limit",
            ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec(),
        ),
        ("huge", 0x7fff_ffffu32.to_be_bytes().to_vec()),
        ("negative", (-5i32).to_be_bytes().to_vec()),
        ("zero", 0u32.to_be_bytes().to_vec()),
        // A frame whose message is neither binary nor compact (nor, starting with a
        // control byte, an unframed non-strict call's name).
        ("garbage", {
            let mut f = 4u32.to_be_bytes().to_vec();
            f.extend_from_slice(b"\x07GET");
            f
        }),
        // A frame whose message starts 0x00 (a non-strict call) but is not one.
        ("bad non-strict", {
            let mut f = 6u32.to_be_bytes().to_vec();
            f.extend_from_slice(b"\x00\x00\x00\x09ab");
            f
        }),
    ];
    for (what, bytes) in cases {
        let mut s = raw(srv.addr);
        s.write_all(&bytes).unwrap();
        assert!(closed(&mut s), "{what}: the connection should be closed");
    }
    // The server itself is fine.
    still_works(&mut raw(srv.addr));
    // An unframed client (0x80 0x01 would read as a negative length) is answered unframed.
    let mut s = raw(srv.addr);
    s.write_all(&binary_call("getHostInfo", |_| {})).unwrap();
    let mut reply = vec![0u8; 4];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(
        &reply,
        &[0x80, 0x01, 0x00, 0x02],
        "an unframed strict binary reply"
    );
    // A frame at the limit is read (and here rejected as an unknown method, not closed).
    let mut s = raw(srv.addr);
    let mut big = binary_call("padding", |o| {
        o.write_field_begin(&TFieldIdentifier::new("x", TType::String, 1))
            .unwrap();
        o.write_bytes(&vec![b'x'; MAX_FRAME - 64]).unwrap();
        o.write_field_end().unwrap();
    });
    big.truncate(MAX_FRAME.min(big.len()));
    assert!(big.len() <= MAX_FRAME);
    send_frame(&mut s, &big);
    expect_app_error(
        &read_frame(&mut s),
        "padding",
        ApplicationErrorKind::UnknownMethod,
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_and_binary_clients_share_the_queue() {
    let srv = server().await;
    let mut binary = Client::connect(srv.addr, Proto::Binary);
    let mut compact = Client::connect(srv.addr, Proto::Compact);
    let id = compact
        .enqueue(vec![item("wire", "both", 3, &[0, 1, 2, 255])])
        .remove(0);
    let got = binary.dequeue("wire", "both", 1);
    assert_eq!(got[0].id.as_deref(), Some(id.as_str()));
    assert_eq!(got[0].payload.as_deref(), Some(&[0u8, 1, 2, 255][..]));
    assert!(compact.ack(&[id])[0].error.is_none());
    assert!(compact.topics("wire").is_empty());
    // An unknown method over compact gets its exception in compact.
    let mut s = raw(srv.addr);
    let mut out = Vec::new();
    {
        let mut o = TCompactOutputProtocol::new(&mut out);
        o.write_message_begin(&TMessageIdentifier::new("nope", TMessageType::Call, 3))
            .unwrap();
        o.write_struct_begin(&TStructIdentifier::new("args"))
            .unwrap();
        o.write_field_stop().unwrap();
        o.write_struct_end().unwrap();
        o.write_message_end().unwrap();
    }
    send_frame(&mut s, &out);
    let reply = read_frame(&mut s);
    let mut i = TCompactInputProtocol::new(&reply[..]);
    let ident = i.read_message_begin().unwrap();
    assert_eq!(
        (ident.message_type, ident.sequence_number),
        (TMessageType::Exception, 3)
    );
    let e = thrift::Error::read_application_error_from_in_protocol(&mut i).unwrap();
    assert_eq!(e.kind, ApplicationErrorKind::UnknownMethod);
    srv.stop().await;
}
