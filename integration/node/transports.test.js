// foqsd through npm's `thrift` package, the library Node.js users install: its defaults
// (createConnection with no options: buffered, i.e. unframed, and binary), framed compact,
// and THeader. Each does a real round trip: enqueue, dequeue in priority order, ack.
// FOQS_ADDR (HOST:PORT) names the foqsd and FOQS_METRICS_ADDR its metrics listener;
// scripts/test.sh starts one and sets both.
"use strict";

const test = require("node:test");
const assert = require("node:assert");
const path = require("node:path");
const thrift = require("thrift");

const gen = path.join(__dirname, "..", "..", "gen", "js");
const Foqs = require(path.join(gen, "Foqs"));
const ttypes = require(path.join(gen, "foqs_types"));

const [host, port] = (process.env.FOQS_ADDR || "127.0.0.1:9090").split(":");
const NS = "node";

function connect(options) {
  const conn = thrift.createConnection(host, Number(port), options);
  const errors = [];
  conn.on("error", (e) => errors.push(e));
  const raw = thrift.createClient(Foqs, conn);
  // Stubs from thrift-compiler 0.17 return promises through `thrift.Q`, which the npm
  // package dropped in 0.22; their callback form works with every version.
  const client = new Proxy(raw, {
    get: (c, method) => (req) =>
      new Promise((resolve, reject) => c[method](req, (e, r) => (e ? reject(e) : resolve(r)))),
  });
  return { conn, client, errors };
}

async function roundTrip(options, topic) {
  const { conn, client, errors } = connect(options);
  try {
    const items = [30, 10, 20].map(
      (p) =>
        new ttypes.EnqueueItem({
          ns: NS,
          topic,
          priority: p,
          payload: Buffer.from([p, 0, 255]),
        }),
    );
    const enq = await client.enqueue(new ttypes.EnqueueRequest({ items }));
    assert.ok(enq.results.every((r) => r.error === null && r.id.includes(":")), JSON.stringify(enq));
    const deq = await client.dequeue(
      new ttypes.DequeueRequest({
        topics: [new ttypes.TopicRequest({ ns: NS, topic, count: 10 })],
      }),
    );
    assert.deepStrictEqual(
      deq.items.map((i) => i.priority),
      [10, 20, 30],
    );
    assert.deepStrictEqual([...deq.items[0].payload], [10, 0, 255]);
    const ack = await client.ack(new ttypes.AckRequest({ ids: deq.items.map((i) => i.id) }));
    assert.ok(ack.results.every((r) => r.error === null));
    // A declared error arrives as the declared exception, in the same transport.
    await assert.rejects(
      client.dequeue(
        new ttypes.DequeueRequest({
          topics: [new ttypes.TopicRequest({ ns: NS, topic, count: 1 })],
          wait_ms: -1,
        }),
      ),
      (e) => e instanceof ttypes.FoqsError && e.code === ttypes.ErrorCode.INVALID_ARGUMENT,
    );
    assert.deepStrictEqual(errors, []);
  } finally {
    conn.end();
  }
}

// npm thrift's generated clients flush the transport, not the protocol, so
// THeaderProtocol.flush (which writes the header) never runs: a client set up with
// THeaderProtocol sends plain buffered (unframed) messages, which foqsd serves as such.
// A transport that writes the header itself on flush makes the frames real THeader, so
// the library's THeader reader is tried against foqsd's THeader replies too.
function HeaderFramedTransport(buffer, callback) {
  thrift.TBufferedTransport.call(this, buffer, callback);
  this.setWriteHeader("client_id", "node-test");
}
Object.setPrototypeOf(HeaderFramedTransport.prototype, thrift.TBufferedTransport.prototype);
HeaderFramedTransport.receiver = thrift.TBufferedTransport.receiver;
HeaderFramedTransport.prototype.flush = function () {
  this.writeHeaders();
  return thrift.TBufferedTransport.prototype.flush.call(this);
};

// The number of requests foqsd has served over `transport`, from its metrics.
async function served(transport) {
  const addr = process.env.FOQS_METRICS_ADDR;
  assert.ok(addr, "FOQS_METRICS_ADDR names foqsd's metrics listener (scripts/test.sh sets it)");
  const text = await (await fetch(`http://${addr}/metrics`)).text();
  let n = 0;
  for (const line of text.split("\n")) {
    if (line.startsWith(`foqs_transport_requests_total{transport="${transport}"`)) {
      n += Number(line.split(" ").pop());
    }
  }
  return n;
}

const topic = (name) => `${name}-${process.pid}-${Date.now()}`;

test("the library's defaults: createConnection with empty options (buffered, binary)", () =>
  roundTrip({}, topic("defaults")));

test("framed transport, compact protocol", () =>
  roundTrip({ transport: thrift.TFramedTransport, protocol: thrift.TCompactProtocol }, topic("framed")));

test("THeaderProtocol as the library sets it up (sends unframed, see above)", () =>
  roundTrip({ transport: thrift.TBufferedTransport, protocol: thrift.THeaderProtocol }, topic("header-lib")));

test("THeader frames on the wire (a transport that writes the header)", async () => {
  const before = await served("header");
  await roundTrip({ transport: HeaderFramedTransport, protocol: thrift.THeaderProtocol }, topic("header"));
  const after = await served("header");
  assert.ok(after - before >= 4, `foqsd served ${after - before} THeader requests`);
});
