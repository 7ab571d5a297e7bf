// lib.mjs - what the end-to-end tests share: starting a broker (weft-mqtt or mosquitto) on a
// free 127.0.0.1 port, MQTT.js clients, a raw client that writes bytes of its own choosing and
// parses what comes back, a proxy that can cut a connection at a chosen packet, and the
// registry that run.mjs lists and runs tests from.
//
// BROKER=weft (the default) runs $WEFT_MQTT (the build's bin/weft-mqtt; build/bin/weft-mqtt when
// unset); BROKER=mosquitto runs the Debian mosquitto 2.0. Each test starts its own broker and stops it at the end, so tests
// share nothing and run in any order, one process each. twice.mjs runs them all again on one
// broker (shareBroker): a test that needs a configuration of its own, or stops its broker,
// skips there.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import mqtt from 'mqtt';

export const BROKER = process.env.BROKER || 'weft';
export const tests = new Map();

// test(name, fn): fn receives nothing and throws on failure.
export function test(name, fn) {
	if (tests.has(name)) throw new Error(`duplicate test ${name}`);
	tests.set(name, fn);
}

// skip(why) ends the test as skipped (run.mjs exits 77, which tests/run.sh shows as `skip NAME:
// why`): for a test that cannot run here, never a silent pass.
export class Skip extends Error {}
export function skip(why) {
	throw new Skip(why);
}

// Whether a program is on the PATH (or in /usr/sbin, where Debian puts mosquitto).
export const have = (tool) => `${process.env.PATH}:/usr/sbin`.split(':').some((d) => existsSync(`${d}/${tool}`));

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function assert(cond, what) {
	if (!cond) throw new Error(`assertion failed: ${what}`);
}

export function eq(got, want, what) {
	const g = JSON.stringify(got), w = JSON.stringify(want);
	if (g !== w) throw new Error(`${what}: got ${g}, want ${w}`);
}

// Resolves when cond() holds; rejects after ms.
export async function until(cond, ms, what) {
	const end = Date.now() + ms;
	while (!(await cond())) {
		if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
		await sleep(5);
	}
}

export async function freePort() {
	return new Promise((resolve, reject) => {
		const s = net.createServer();
		s.unref();
		s.on('error', reject);
		s.listen(0, '127.0.0.1', () => {
			const { port } = s.address();
			s.close(() => resolve(port));
		});
	});
}

let broker = null;
let brokerStarted = false; // a test that skips for want of a tool starts none
let shared = null; // the broker every test uses (twice.mjs), or null

// From now on startBroker() with the default configuration returns b instead of starting one
// (null: back to a broker per test).
export function shareBroker(b) {
	shared = b;
}

// Options mosquitto and weft-mqtt share (mosquitto's configuration syntax); `mosquittoOnly`
// holds the ones weft-mqtt need not know (it behaves that way already).
export async function startBroker(conf = {}, mosquittoOnly = {}) {
	if (shared) {
		if (Object.keys(conf).length || Object.keys(mosquittoOnly).length)
			skip('needs a broker configured for it, not the shared one');
		brokerStarted = true;
		broker = shared;
		return shared;
	}
	brokerStarted = true;
	const port = await freePort();
	const dir = mkdtempSync(path.join(os.tmpdir(), 'mqtt-e2e-'));
	const lines = [`listener ${port} 127.0.0.1`, 'allow_anonymous true', 'persistence false'];
	const all = BROKER === 'mosquitto' ? { ...conf, ...mosquittoOnly } : conf;
	for (const [k, v] of Object.entries(all)) lines.push(`${k} ${v}`);
	const file = path.join(dir, 'broker.conf');
	writeFileSync(file, lines.join('\n') + '\n');
	let cmd, args;
	if (BROKER === 'mosquitto') {
		cmd = 'mosquitto';
		args = ['-c', file];
	} else {
		cmd = process.env.WEFT_MQTT || new URL('../../build/bin/weft-mqtt', import.meta.url).pathname;
		args = Object.keys(conf).length ? ['-c', file] : ['-p', String(port)];
	}
	const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
	let log = '';
	child.stderr.on('data', (d) => { log += d; });
	let exited = false, status = null;
	child.on('exit', (code, signal) => { exited = true; status = { code, signal }; });
	// Every listener the configuration names (TLS, websockets, metrics), not only the first:
	// a slow start (under TSan) opens them one after the other.
	const ports = [...lines.join('\n').matchAll(/^(?:listener|metrics_listener) (\d+)/gm)].map((m) => +m[1]);
	const end = Date.now() + 5000;
	for (const p of ports) {
		for (;;) {
			if (exited) throw new Error(`${cmd} ${args.join(' ')} exited: ${log}`);
			const ok = await new Promise((resolve) => {
				const s = net.connect(p, '127.0.0.1');
				s.on('connect', () => { s.destroy(); resolve(true); });
				s.on('error', () => resolve(false));
			});
			if (ok) break;
			if (Date.now() > end) {
				child.kill('SIGKILL'); // not left running after the test
				throw new Error(`${cmd} did not listen on ${p}: ${log}`);
			}
			await sleep(20);
		}
	}
	broker = { port, child, dir, log: () => log, exited: () => exited, status: () => status };
	return broker;
}

// Stops the broker with SIGTERM; returns what is wrong with how it ran or ended (a sanitizer's
// report, no exit within 5 s, an exit status other than 0), or null.
export async function stopBroker() {
	if (!broker) return null;
	if (broker === shared) skip('stops its broker, and the broker is shared');
	const b = broker;
	broker = null;
	let late = false;
	if (!b.exited()) {
		const gone = new Promise((r) => b.child.on('exit', r));
		b.child.kill('SIGTERM');
		await Promise.race([gone, sleep(5000)]);
		if (!b.exited()) {
			late = true;
			b.child.kill('SIGKILL');
			await gone;
		}
	}
	rmSync(b.dir, { recursive: true, force: true });
	const log = b.log(), st = b.status();
	if (/Sanitizer|runtime error:/.test(log)) return `the broker's sanitizer reported:\n${log}`;
	if (late) return 'the broker did not exit within 5 s of SIGTERM';
	if (st.code !== 0) return `the broker exited with ${st.signal || st.code} after SIGTERM: ${log}`;
	return null;
}

// Kill the broker with SIGKILL (a crash: no chance to write anything) and wait until it is gone.
// A later startBroker starts a new one (on a new port).
export async function crashBroker() {
	if (!broker) return;
	if (broker === shared) skip('kills its broker, and the broker is shared');
	const b = broker;
	broker = null;
	if (!b.exited()) {
		const gone = new Promise((r) => b.child.on('exit', r));
		b.child.kill('SIGKILL');
		await gone;
	}
	rmSync(b.dir, { recursive: true, force: true });
	if (/Sanitizer|runtime error:/.test(b.log())) throw new Error(`the broker's sanitizer reported:\n${b.log()}`);
}

// Whatever way this process ends, its broker ends with it.
function killNow() {
	for (const p of started) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
	if (!broker) return;
	if (!broker.exited()) broker.child.kill('SIGKILL');
	rmSync(broker.dir, { recursive: true, force: true });
	broker = null;
}
process.on('exit', killNow);
for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP']) process.on(sig, () => process.exit(1));

// Whether the broker the test started is still running (true if it started none).
// A test that starts and kills brokers of its own skips where every test shares one
// (twice.mjs).
export function ownBrokers() {
	if (shared) skip('runs brokers of its own, and the broker is shared');
}

export function brokerAlive() {
	return !brokerStarted || (broker && !broker.exited());
}

// The resident memory of broker b's process in KiB (VmRSS).
export function brokerRssKb(b) {
	return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${b.child.pid}/status`, 'utf8'))[1]);
}

// Whether broker b runs under a sanitizer, whose RSS says little of what the broker holds
// (shadow memory, freed memory kept in quarantine): memory bounds are not checked there.
export function brokerSanitized(b) {
	return /lib[at]san/.test(readFileSync(`/proc/${b.child.pid}/maps`, 'utf8'));
}

const clients = [], raws = [];

// An MQTT.js client, connected. version: 4 (3.1.1) or 5. Messages go to c.messages as
// { topic, payload (string), packet }.
export async function client(version, opts = {}, port = broker.port) {
	const c = mqtt.connect({
		host: '127.0.0.1', port, protocolVersion: version, reconnectPeriod: 0,
		connectTimeout: 3000, ...opts,
	});
	c.messages = [];
	c.on('message', (topic, payload, packet) => c.messages.push({ topic, payload: payload.toString(), packet }));
	c.on('error', (e) => { c.lastError = e; });
	c.on('disconnect', (p) => { c.disconnectPacket = p; });
	clients.push(c);
	await new Promise((resolve, reject) => {
		c.once('connect', (connack) => { c.connack = connack; resolve(); });
		c.once('error', reject);
		c.once('close', () => reject(new Error(`connection closed before CONNACK${c.lastError ? ': ' + c.lastError.message : ''}`)));
	});
	return c;
}

// Two clients of the given version on ok/t; the function returned checks that a message
// between them still goes through (within 3 s) and that both are still connected.
export async function bystanders(version) {
	const s = await client(version), p = await client(version);
	await s.subscribeAsync('ok/t', { qos: 1 });
	return async (what) => {
		const n = s.messages.length;
		await p.publishAsync('ok/t', what, { qos: 1 });
		await until(() => s.messages.length > n, 3000, `the bystanders' message after ${what}`);
		assert(s.connected && p.connected, `bystanders still connected after ${what}`);
	};
}

export async function closeAll() {
	for (const r of raws.splice(0)) r.close();
	for (const p of started.splice(0)) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
	await Promise.all(clients.splice(0).map((c) => new Promise((r) => c.end(true, {}, r))));
}

// Run a command line tool; resolves with { code, stdout, stderr }.
export function run(cmd, args, { timeout = 5000, input } = {}) {
	return new Promise((resolve) => {
		const p = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
		let stdout = '', stderr = '';
		p.stdout.on('data', (d) => { stdout += d; });
		p.stderr.on('data', (d) => { stderr += d; });
		const t = setTimeout(() => p.kill('SIGKILL'), timeout);
		p.on('exit', (code, signal) => { clearTimeout(t); resolve({ code, signal, stdout, stderr, proc: p }); });
		if (input !== undefined) p.stdin.end(input);
		else p.stdin.end();
	});
}

const started = [];

// Start a command line tool in the background; .done resolves as run() does. It is killed, if
// still running, when the test ends.
export function start(cmd, args) {
	const p = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
	started.push(p);
	let stdout = '', stderr = '';
	p.stdout.on('data', (d) => { stdout += d; });
	p.stderr.on('data', (d) => { stderr += d; });
	const done = new Promise((resolve) => p.on('exit', (code, signal) => resolve({ code, signal, stdout, stderr })));
	return { proc: p, done, out: () => stdout, err: () => stderr };
}

// ---- raw packets -----------------------------------------------------------------------------

export function varint(n) {
	const out = [];
	do {
		let b = n % 128;
		n = Math.floor(n / 128);
		if (n > 0) b |= 128;
		out.push(b);
	} while (n > 0);
	return Buffer.from(out);
}

export const str = (s) => {
	const b = Buffer.from(s, 'utf8');
	return Buffer.concat([Buffer.from([b.length >> 8, b.length & 255]), b]);
};

export const u16 = (n) => Buffer.from([n >> 8, n & 255]);
export const u32 = (n) => Buffer.from([n >>> 24, (n >> 16) & 255, (n >> 8) & 255, n & 255]);

export function packet(type, flags, body) {
	return Buffer.concat([Buffer.from([(type << 4) | flags]), varint(body.length), body]);
}

// CONNECT: version 3 (3.1), 4 (3.1.1) or 5; props (5.0) as raw bytes.
export function connectPacket({ version = 4, clientId = 'raw', clean = true, keepalive = 60,
	props = Buffer.alloc(0), protocolName = version === 3 ? 'MQIsdp' : 'MQTT', flags } = {}) {
	const f = flags !== undefined ? flags : (clean ? 2 : 0);
	const parts = [str(protocolName), Buffer.from([version, f]), u16(keepalive)];
	if (version === 5) parts.push(varint(props.length), props);
	parts.push(str(clientId));
	return packet(1, 0, Buffer.concat(parts));
}

export function subscribePacket(id, filter, options, version = 4, props = Buffer.alloc(0)) {
	const parts = [u16(id)];
	if (version === 5) parts.push(varint(props.length), props);
	parts.push(str(filter), Buffer.from([options]));
	return packet(8, 2, Buffer.concat(parts));
}

export function publishPacket(topic, payload, { qos = 0, id = 1, retain = false, version = 4,
	props = Buffer.alloc(0) } = {}) {
	const parts = [str(topic)];
	if (qos) parts.push(u16(id));
	if (version === 5) parts.push(varint(props.length), props);
	parts.push(Buffer.from(payload));
	return packet(3, (qos << 1) | (retain ? 1 : 0), Buffer.concat(parts));
}

// A TCP client that sends what it is told and parses the broker's packets into c.packets as
// { type, flags, body }. c.closed turns true when the broker closes the connection. localAddress:
// the source address (any 127.x.y.z).
export async function raw(port = broker.port, localAddress = undefined) {
	const s = net.connect({ port, host: '127.0.0.1', localAddress });
	await new Promise((resolve, reject) => { s.once('connect', resolve); s.once('error', reject); });
	const c = { sock: s, packets: [], closed: false, buf: Buffer.alloc(0) };
	raws.push(c);
	s.on('data', (d) => {
		c.buf = Buffer.concat([c.buf, d]);
		for (;;) {
			if (c.buf.length < 2) break;
			let len = 0, mul = 1, i = 1;
			for (; i < c.buf.length && i < 5; i++) {
				len += (c.buf[i] & 127) * mul;
				mul *= 128;
				if (!(c.buf[i] & 128)) break;
			}
			if (i >= c.buf.length || c.buf.length < i + 1 + len) break;
			c.packets.push({ type: c.buf[0] >> 4, flags: c.buf[0] & 15, body: c.buf.subarray(i + 1, i + 1 + len) });
			c.buf = c.buf.subarray(i + 1 + len);
		}
	});
	s.on('error', () => {});
	s.on('close', () => { c.closed = true; });
	c.send = (b) => new Promise((r) => s.write(b, () => r()));
	c.of = (type) => c.packets.filter((p) => p.type === type);
	c.close = () => s.destroy();
	return c;
}

// ---- a proxy that cuts a connection once ------------------------------------------------------

// Forwards 127.0.0.1:proxy.port to the broker. cut({ dir, type }) arms it: the first packet of
// that type going in that direction ('up': client to broker, 'down': broker to client) is not
// forwarded, and both sockets are destroyed at once; later connections pass untouched.
export async function proxy(target = broker.port) {
	const p = { armed: null, cuts: 0 };
	const server = net.createServer((down) => {
		const up = net.connect(target, '127.0.0.1');
		const kill = () => { down.destroy(); up.destroy(); };
		const watch = (from, to, dir) => {
			let buf = Buffer.alloc(0);
			from.on('data', (d) => {
				if (!p.armed || p.armed.dir !== dir) { to.write(d); return; }
				// Split into packets so that the ones before the cut still go through.
				buf = Buffer.concat([buf, d]);
				for (;;) {
					let len = 0, mul = 1, i = 1;
					for (; i < buf.length && i < 5; i++) {
						len += (buf[i] & 127) * mul;
						mul *= 128;
						if (!(buf[i] & 128)) break;
					}
					if (buf.length < 2 || i >= buf.length || buf.length < i + 1 + len) break;
					const pkt = buf.subarray(0, i + 1 + len);
					buf = buf.subarray(i + 1 + len);
					if (p.armed && p.armed.dir === dir && pkt[0] >> 4 === p.armed.type) {
						p.armed = null;
						p.cuts++;
						kill();
						return;
					}
					to.write(pkt);
				}
			});
		};
		watch(down, up, 'up');
		watch(up, down, 'down');
		down.on('error', kill);
		up.on('error', kill);
		down.on('close', kill);
		up.on('close', kill);
	});
	await new Promise((r) => server.listen(0, '127.0.0.1', r));
	p.port = server.address().port;
	p.cut = (how) => { p.armed = how; };
	p.close = () => server.close();
	return p;
}

// Packet type numbers.
export const CONNACK = 2, PUBLISH = 3, PUBACK = 4, PUBREC = 5, PUBREL = 6, PUBCOMP = 7,
	SUBACK = 9, DISCONNECT = 14;
