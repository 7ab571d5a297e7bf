// metrics.mjs - end-to-end tests of weft-mqtt's Prometheus endpoint (metrics_listener).
//
// Covers: GET /metrics answers 200 in the text exposition format 0.0.4 (every sample line is
// `name{labels} value` after a # TYPE line for its name, no name typed twice); the counters
// rise with real traffic (N QoS 1 messages through the broker raise messages received and sent
// by at least N, bytes too); per-worker scheduler counters are there; a malformed request line
// gets 400, an unknown path 404, another method 405, an endless head 431; the queued gauge and
// the drop counters by reason follow a session away (max_queued_messages); clients that connect
// and send nothing do not keep another client from its answer, and are cut at the read deadline.
// mosquitto has no such endpoint: against it the tests only start it and pass.
import net from 'node:net';
import http from 'node:http';
import { test, startBroker, client, until, eq, assert, freePort, BROKER } from './lib.mjs';

async function metricsBroker() {
	if (BROKER === 'mosquitto') {
		await startBroker();
		return null;
	}
	const port = await freePort();
	await startBroker({ metrics_listener: `${port} 127.0.0.1` });
	return port;
}

function get(port, path = '/metrics', method = 'GET') {
	return new Promise((resolve, reject) => {
		const req = http.request({ host: '127.0.0.1', port, path, method, agent: false }, (res) => {
			let body = '';
			res.setEncoding('utf8');
			res.on('data', (d) => { body += d; });
			res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
		});
		req.setTimeout(4000, () => req.destroy(new Error(`no answer to ${method} ${path} in 4 s`)));
		req.on('error', reject);
		req.end();
	});
}

// Raw bytes in, the whole answer out (the server closes).
function rawRequest(port, bytes) {
	return new Promise((resolve, reject) => {
		const s = net.connect(port, '127.0.0.1');
		let out = '';
		s.on('data', (d) => { out += d; });
		s.on('end', () => resolve(out));
		s.on('error', (e) => (out ? resolve(out) : reject(e)));
		s.setTimeout(8000, () => s.destroy(new Error('no answer in 8 s')));
		s.write(bytes);
	});
}

const NAME = '[a-zA-Z_:][a-zA-Z0-9_:]*';
const LABEL = '[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\\\\n]|\\\\.)*"';
const SAMPLE = new RegExp(`^(${NAME})(\\{${LABEL}(?:,${LABEL})*\\})? (-?[0-9][0-9.eE+-]*|NaN|[+-]Inf)$`);

// Parse the exposition text; returns Map "name{labels}" -> number. Throws on a malformed line.
function parse(text) {
	assert(text.endsWith('\n'), 'the text ends with a newline');
	const typed = new Map(), samples = new Map();
	for (const line of text.slice(0, -1).split('\n')) {
		let m;
		if ((m = /^# TYPE (\S+) (counter|gauge|histogram|summary|untyped)$/.exec(line))) {
			assert(!typed.has(m[1]), `${m[1]} typed once`);
			typed.set(m[1], m[2]);
		} else if (line.startsWith('# HELP ')) {
			assert(/^# HELP \S+ .+$/.test(line), `HELP line: ${line}`);
		} else {
			m = SAMPLE.exec(line);
			assert(m, `sample line: ${JSON.stringify(line)}`);
			assert(typed.has(m[1]), `a TYPE line before ${m[1]}`);
			assert(!samples.has(m[1] + (m[2] || '')), `${m[1]}${m[2] || ''} once`);
			samples.set(m[1] + (m[2] || ''), Number(m[3]));
		}
	}
	return samples;
}

async function scrape(port) {
	const r = await get(port);
	eq(r.status, 200, 'status of GET /metrics');
	assert(r.headers['content-type'].startsWith('text/plain; version=0.0.4'), `content type ${r.headers['content-type']}`);
	return parse(r.body);
}

test('metrics_counters', async () => {
	const port = await metricsBroker();
	if (!port) return;
	const before = await scrape(port);
	for (const k of ['weft_mqtt_clients_connected', 'weft_mqtt_connections_total', 'weft_mqtt_messages_received_total',
		'weft_mqtt_messages_sent_total', 'weft_mqtt_bytes_received_total', 'weft_mqtt_bytes_sent_total',
		'weft_mqtt_messages_dropped_total', 'weft_mqtt_queued_messages', 'weft_mqtt_retained_messages',
		'weft_mqtt_subscriptions', 'weft_mqtt_deliveries_dropped_total{reason="qos0_queue_full"}',
		'weft_worker_switches_total{worker="0"}', 'weft_worker_parks_total{worker="0"}',
		'weft_worker_wakes_total{worker="0"}', 'weft_worker_steals_total{worker="0"}',
		'weft_worker_idle_seconds_total{worker="0"}'])
		assert(before.has(k), `${k} is there`);
	for (const part of ['resident', 'malloc_in_use', 'malloc_free', 'pool_free_lists', 'topic_tree'])
		assert(before.get(`weft_mqtt_memory_bytes{part="${part}"}`) >= 0, `memory part ${part} is there`);
	assert(before.get('weft_mqtt_memory_bytes{part="resident"}') > 1e6, 'resident memory in bytes');
	assert(before.get('weft_mqtt_memory_bytes{part="topic_tree"}') > 0, 'the tree has its root');
	const N = 50;
	const s = await client(4), p = await client(5);
	await s.subscribeAsync('m/#', { qos: 1 });
	for (let i = 0; i < N; i++) await p.publishAsync(`m/${i}`, `payload ${i}`, { qos: 1 });
	await until(() => s.messages.length >= N, 3000, `${N} messages`);
	const after = await scrape(port);
	const rose = (k) => after.get(k) - before.get(k);
	assert(rose('weft_mqtt_messages_received_total') >= N, `messages received rose by ${rose('weft_mqtt_messages_received_total')}, want >= ${N}`);
	assert(rose('weft_mqtt_messages_sent_total') >= N, `messages sent rose by ${rose('weft_mqtt_messages_sent_total')}, want >= ${N}`);
	assert(rose('weft_mqtt_bytes_received_total') >= N * 10, `bytes received rose by ${rose('weft_mqtt_bytes_received_total')}`);
	assert(rose('weft_mqtt_bytes_sent_total') >= N * 10, `bytes sent rose by ${rose('weft_mqtt_bytes_sent_total')}`);
	assert(rose('weft_mqtt_connections_total') >= 2, 'connections rose by 2');
	eq(after.get('weft_mqtt_clients_connected'), 2, 'clients connected');
	assert(after.get('weft_mqtt_subscriptions') >= 1, 'a subscription');
	eq(after.get('weft_mqtt_queued_messages'), 0, 'nothing queued once all is delivered');
	let switches = 0;
	for (const [k, v] of after) if (k.startsWith('weft_worker_switches_total{')) switches += v;
	assert(switches > 0, 'workers switched into tasks');
	const head = await get(port, '/metrics', 'HEAD');
	eq([head.status, head.body], [200, ''], 'HEAD: status and empty body');
});

test('metrics_bad_requests', async () => {
	const port = await metricsBroker();
	if (!port) return;
	eq((await get(port, '/nope')).status, 404, 'unknown path');
	eq((await get(port, '/metrics', 'POST')).status, 405, 'POST');
	assert((await rawRequest(port, 'garbage\r\n\r\n')).startsWith('HTTP/1.1 400 '), 'garbage gets 400');
	assert((await rawRequest(port, 'GET /metrics\r\n\r\n')).startsWith('HTTP/1.1 400 '), 'no version gets 400');
	assert((await rawRequest(port, 'GET metrics HTTP/1.1\r\n\r\n')).startsWith('HTTP/1.1 400 '), 'no slash gets 400');
	assert((await rawRequest(port, `GET /metrics HTTP/1.1\r\nX: ${'a'.repeat(8000)}\r\n\r\n`)).startsWith('HTTP/1.1 431 '),
		'an endless head gets 431');
	eq((await get(port)).status, 200, 'still serving');
});

test('metrics_silent_clients', async () => {
	const port = await metricsBroker();
	if (!port) return;
	// Connections that say nothing (and one that stops half-way) hold only their own tasks.
	const silent = [];
	for (let i = 0; i < 8; i++) {
		const s = net.connect(port, '127.0.0.1');
		s.on('error', () => {});
		silent.push(s);
		if (i === 0) s.write('GET /metr');
	}
	await Promise.all(silent.map((s) => new Promise((r) => (s.connecting ? s.once('connect', r) : r()))));
	const t0 = Date.now();
	await scrape(port);
	const ms = Date.now() - t0;
	assert(ms < 2000, `GET /metrics beside 8 silent clients took ${ms} ms`);
	// The read deadline (5 s) closes them.
	let closed = 0;
	for (const s of silent) s.once('close', () => closed++);
	await until(() => closed === silent.length, 8000, 'the silent clients to be closed');
});

// A client's end() resolves once its DISCONNECT is written; the broker takes the session offline
// a little later, and only then do messages for it queue (before, they go out to the closing
// connection). The connected count drops after that: wait for it.
async function connectedIs(port, n) {
	const connected = async () => (await scrape(port)).get('weft_mqtt_clients_connected') === n;
	await until(connected, 3000, `${n} clients connected`);
}

test('metrics_queued_and_dropped', async () => {
	if (BROKER === 'mosquitto') return void (await startBroker());
	const port = await freePort();
	await startBroker({ metrics_listener: `${port} 127.0.0.1`, max_queued_messages: 3 });
	// A persistent 3.1.1 session away: QoS 1 messages queue (3 of them), the rest are dropped.
	let s = await client(4, { clientId: 'away', clean: false });
	await s.subscribeAsync('q/#', { qos: 1 });
	await new Promise((r) => s.end(false, {}, r));
	await connectedIs(port, 0);
	const p = await client(4);
	for (let i = 0; i < 5; i++) await p.publishAsync('q/x', `m${i}`, { qos: 1 });
	await p.publishAsync('q/x', 'zero', { qos: 0 });
	// QoS 0 has no answer to wait for; a QoS 1 publish after it does, and the broker takes a
	// connection's packets in order: once it is acknowledged, the QoS 0 one has been handled.
	await p.publishAsync('fence', 'f', { qos: 1 });
	let m = await scrape(port);
	eq(m.get('weft_mqtt_queued_messages'), 3, 'queued while away');
	eq(m.get('weft_mqtt_deliveries_dropped_total{reason="queue_full"}'), 2, 'dropped beyond max_queued_messages');
	eq(m.get('weft_mqtt_deliveries_dropped_total{reason="qos0_queue_full"}'), 1, 'QoS 0 to an offline client');
	s = await client(4, { clientId: 'away', clean: false });
	await until(() => s.messages.length >= 3, 3000, 'the 3 queued messages');
	m = await scrape(port);
	eq(m.get('weft_mqtt_queued_messages'), 0, 'queued after the session came back');
	// A session discarded with messages queued (clean session from the same id) takes them along.
	let g = await client(4, { clientId: 'gone', clean: false });
	await g.subscribeAsync('g/#', { qos: 1 });
	await new Promise((r) => g.end(false, {}, r));
	await connectedIs(port, 2); // p, and 'away' back
	for (let i = 0; i < 2; i++) await p.publishAsync('g/x', `g${i}`, { qos: 1 });
	eq((await scrape(port)).get('weft_mqtt_queued_messages'), 2, 'queued for the second session');
	g = await client(4, { clientId: 'gone', clean: true });
	eq((await scrape(port)).get('weft_mqtt_queued_messages'), 0, 'queued after a clean start dropped the session');
});
