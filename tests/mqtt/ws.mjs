// ws.mjs - end-to-end tests of the WebSockets listener (`listener PORT` + `protocol websockets`):
// MQTT.js over ws:// from node and from headless Chromium, with subscribers on the plain TCP
// listener of the same broker.
//
// Covers: MQTT.js 3.1.1 and 5.0 over ws:// publishing to a TCP subscriber and receiving from a
// TCP publisher, with a 200 kB message so packets span frames and reads; a page the test serves
// to headless Chromium (Debian chromium) loads MQTT.js's browser bundle from node_modules,
// connects over ws://, publishes to a mosquitto_sub on TCP and receives its own messages back;
// a request that is not a WebSocket upgrade gets HTTP 400 and the broker goes on; a
// password_file applies to WebSocket clients too.
//
// The Chromium test skips where chromium or mosquitto_sub is missing.
import { existsSync, readFileSync, mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { test, startBroker, client, freePort, start, until, eq, assert, sleep, have, skip } from './lib.mjs';


// A broker with its usual TCP listener and a websockets one; b.wsport is the latter.
async function wsBroker(extra = {}) {
	const wsport = await freePort();
	const b = await startBroker({ listener: `${wsport} 127.0.0.1\nprotocol websockets`, ...extra });
	b.wsport = wsport;
	await until(() => true, 10, '');
	return b;
}

const wsClient = (b, version, opts = {}) =>
	client(version, { protocol: 'ws', path: '/mqtt', ...opts }, b.wsport);

for (const v of [4, 5]) {
	const tag = v === 4 ? 'v311' : 'v5';
	test(`ws_mqttjs_${tag}`, async () => {
		const b = await wsBroker();
		const tcp = await client(v);
		await tcp.subscribeAsync('ws/#', { qos: 1 });
		const w = await wsClient(b, v);
		await w.subscribeAsync('tcp/#', { qos: 1 });
		const big = 'x'.repeat(200000);
		await w.publishAsync('ws/small', 'hello', { qos: 1 });
		await w.publishAsync('ws/big', big, { qos: 1 });
		await w.publishAsync('ws/q2', 'two', { qos: 2 });
		await tcp.publishAsync('tcp/back', 'back', { qos: 1 });
		await tcp.publishAsync('tcp/big', big, { qos: 0 });
		await until(() => tcp.messages.length >= 3 && w.messages.length >= 2, 5000, 'the messages');
		eq(tcp.messages.map((m) => `${m.topic} ${m.payload.length}`), ['ws/small 5', 'ws/big 200000', 'ws/q2 3'],
			'the TCP subscriber got what the WebSocket client published');
		eq(w.messages.map((m) => `${m.topic} ${m.payload.length}`), ['tcp/back 4', 'tcp/big 200000'],
			'the WebSocket client got what the TCP client published');
		assert(tcp.messages[1].payload === big && w.messages[1].payload === big, 'the large payloads intact');
	});
}

test('ws_not_an_upgrade', async () => {
	const b = await wsBroker();
	const reply = await new Promise((resolve) => {
		const s = net.connect(b.wsport, '127.0.0.1');
		let got = '';
		s.on('data', (d) => { got += d; });
		s.on('close', () => resolve(got));
		s.on('error', () => resolve(got));
		s.write('GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n');
	});
	assert(/^HTTP\/1\.1 400/.test(reply), `HTTP 400 for a plain GET: ${JSON.stringify(reply.slice(0, 80))}`);
	const w = await wsClient(b, 5);
	await w.publishAsync('still/here', 'ok', { qos: 1 });
});

test('ws_password_v5', async () => {
	if (!have('mosquitto_passwd')) skip('mosquitto_passwd is not installed (Debian: mosquitto)');
	const dir = mkdtempSync(path.join(os.tmpdir(), 'mqtt-ws-'));
	try {
		const pw = path.join(dir, 'passwd');
		await new Promise((r) => spawn('mosquitto_passwd', ['-c', '-b', pw, 'web', 'web-pw']).on('exit', r));
		const b = await wsBroker({ password_file: pw, allow_anonymous: 'false' });
		let code = 0;
		await wsClient(b, 5, { username: 'web', password: 'nope' }).catch((e) => { code = e.code; });
		eq(code, 0x86, 'a wrong password over WebSockets: CONNACK 0x86');
		const w = await wsClient(b, 5, { username: 'web', password: 'web-pw' });
		await w.publishAsync('auth/ok', 'x', { qos: 1 });
	} finally {
		rmSync(dir, { recursive: true, force: true });
	}
});

// MQTT.js's browser bundle in headless Chromium, from a page this test serves.
test('ws_chromium_v5', async () => {
	const bundle = new URL('./node_modules/mqtt/dist/mqtt.min.js', import.meta.url).pathname;
	if (!have('chromium') || !have('mosquitto_sub') || !existsSync(bundle))
		skip('needs chromium (Debian chromium), mosquitto_sub and MQTT.js\'s browser bundle');
	const b = await wsBroker();
	const sub = start('mosquitto_sub', ['-h', '127.0.0.1', '-p', String(b.port), '-t', 'browser/#',
		'-q', '1', '-F', '%t %l', '-i', 'tcp-sub']);
	await until(() => true, 10, '');
	// mosquitto_sub is subscribed once the session exists: wait for a probe to reach it
	const probe = await client(5);
	for (let i = 0; i < 100 && !sub.out().includes('browser/probe'); i++) {
		await probe.publishAsync('browser/probe', 'p', { qos: 1 });
		await sleep(50);
	}
	assert(sub.out().includes('browser/probe'), `mosquitto_sub subscribed (${sub.err()})`);
	const js = readFileSync(bundle);
	let result = null;
	const page = `<!doctype html><html><body><script src="/mqtt.min.js"></script><script>
const got = [];
const report = (s) => fetch('/result?' + encodeURIComponent(s));
const c = mqtt.connect('ws://127.0.0.1:${b.wsport}/mqtt', { protocolVersion: 5, clientId: 'chromium', reconnectPeriod: 0 });
c.on('error', (e) => report('ERROR ' + e));
c.on('message', (t, p) => { got.push(t + ' ' + p.length);
  if (got.length == 2) { report('DONE ' + got.sort().join(',')); c.end(); } });
c.on('connect', () => c.subscribe('browser/self/#', { qos: 1 }, () => {
  c.publish('browser/self/hello', 'from chromium', { qos: 1 });
  c.publish('browser/self/big', new Uint8Array(100000), { qos: 1 }); }));
</script></body></html>`;
	const srv = http.createServer((req, res) => {
		if (req.url === '/') { res.setHeader('content-type', 'text/html'); res.end(page); }
		else if (req.url === '/mqtt.min.js') { res.setHeader('content-type', 'text/javascript'); res.end(js); }
		else if (req.url.startsWith('/result?')) { result = decodeURIComponent(req.url.slice(8)); res.end('ok'); }
		else { res.statusCode = 404; res.end(); }
	});
	await new Promise((r) => srv.listen(0, '127.0.0.1', r));
	const profile = mkdtempSync(path.join(os.tmpdir(), 'mqtt-chromium-'));
	// In a process group of its own: its helper processes write to the profile too, and all of
	// them must be gone before it is removed.
	const browser = spawn('chromium', ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
		'--disable-dev-shm-usage', `--user-data-dir=${profile}`, `http://127.0.0.1:${srv.address().port}/`],
	{ stdio: 'ignore', detached: true });
	try {
		await until(() => result !== null, 15000, 'the page to report');
		console.log(`page reported: ${result}`);
		eq(result, 'DONE browser/self/big 100000,browser/self/hello 13', 'what the page received back');
		await until(() => sub.out().includes('browser/self/big'), 3000, 'mosquitto_sub to get the page\'s messages');
		const lines = sub.out().split('\n').filter((l) => l.startsWith('browser/self/'));
		eq(lines, ['browser/self/hello 13', 'browser/self/big 100000'], 'mosquitto_sub on TCP got the page\'s messages');
	} finally {
		const group = (sig) => { try { process.kill(-browser.pid, sig); return true; } catch { return false; } };
		group('SIGKILL');
		for (let i = 0; i < 50 && group(0); i++) await sleep(100);
		srv.close();
		sub.proc.kill();
		rmSync(profile, { recursive: true, force: true });
	}
});
