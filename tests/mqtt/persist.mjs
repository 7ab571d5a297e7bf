// persist.mjs - end-to-end tests of `persistence true`: what survives a restart (SIGTERM) and a
// crash (SIGKILL), and the crash test of issue #8.
//
// Covers: retained messages, persistent sessions (3.1.1 without clean session, 5.0 with a
// session expiry interval) with their subscriptions and the QoS 1/2 messages queued for them
// while they were away, after a restart and after kill -9; an inflight QoS 1 message (sent, not
// acknowledged) is sent again with DUP and its packet id after kill -9; a clean session leaves
// nothing behind; messages that expire while queued are not delivered and, like acknowledged
// ones, leave no row in the database. The crash test kills the broker with SIGKILL five times
// under QoS 1 load from a publisher that records every PUBACK it got, restarts it on the same
// database each time, and checks that a persistent subscriber receives every acknowledged
// message: zero loss.
//
// weft-mqtt only (BROKER=mosquitto writes its database only at intervals and on exit, so it
// loses acknowledged messages on kill -9 by design).
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test, startBroker, crashBroker, stopBroker, client, raw, connectPacket, subscribePacket,
	run, until, eq, assert, sleep, BROKER, PUBLISH } from './lib.mjs';

const dirs = [];
process.on('exit', () => { for (const d of dirs) rmSync(d, { recursive: true, force: true }); });

function store() {
	const d = mkdtempSync(path.join(os.tmpdir(), 'mqtt-persist-'));
	dirs.push(d);
	return { persistence: 'true', persistence_location: d, max_queued_messages: '100000' };
}

const got = (c) => c.messages.map((m) => `${m.topic} ${m.payload}`);

for (const how of ['restart', 'kill9']) {
	for (const v of [4, 5]) {
		const tag = `${how}_${v === 4 ? 'v311' : 'v5'}`;
		test(`persist_${tag}`, async () => {
			if (BROKER !== 'weft') return;
			const conf = store();
			await startBroker(conf);
			const persistent = v === 5 ? { clean: false, properties: { sessionExpiryInterval: 3600 } } : { clean: false };
			let sub = await client(v, { clientId: 'keeper', ...persistent });
			await sub.subscribeAsync({ 'keep/q1': { qos: 1 }, 'keep/q2': { qos: 2 } });
			const cleanSub = await client(v, { clientId: 'forgetful', clean: true });
			await cleanSub.subscribeAsync('keep/#', { qos: 1 });
			sub.end(true);
			await sleep(100);
			const pub = await client(v);
			await pub.publishAsync('ret/a', 'retained a', { qos: 1, retain: true });
			await pub.publishAsync('ret/b', 'retained b', { qos: 0, retain: true });
			await pub.publishAsync('ret/b', '', { qos: 1, retain: true }); // cleared
			for (let i = 0; i < 5; i++) await pub.publishAsync('keep/q1', `one ${i}`, { qos: 1 });
			for (let i = 0; i < 3; i++) await pub.publishAsync('keep/q2', `two ${i}`, { qos: 2 });
			if (how === 'restart') {
				const wrong = await stopBroker();
				if (wrong) throw new Error(wrong);
			} else {
				await crashBroker();
			}
			await startBroker(conf);
			sub = await client(v, { clientId: 'keeper', ...persistent });
			eq(sub.connack.sessionPresent, true, 'the session is present after the restart');
			await until(() => sub.messages.length >= 8, 5000, 'the queued messages');
			await sleep(200);
			eq(got(sub), ['keep/q1 one 0', 'keep/q1 one 1', 'keep/q1 one 2', 'keep/q1 one 3', 'keep/q1 one 4',
				'keep/q2 two 0', 'keep/q2 two 1', 'keep/q2 two 2'], 'queued QoS 1 and 2 messages, in order');
			eq(sub.messages.map((m) => m.packet.qos), [1, 1, 1, 1, 1, 2, 2, 2], 'at their QoS');
			// the subscriptions came back too: a new message reaches the session
			const pub2 = await client(v);
			await pub2.publishAsync('keep/q1', 'after', { qos: 1 });
			await until(() => sub.messages.length >= 9, 3000, 'a live message through the restored subscription');
			const r = await client(v);
			await r.subscribeAsync('ret/#', { qos: 1 });
			await until(() => r.messages.length >= 1, 3000, 'the retained message');
			await sleep(200);
			eq(got(r), ['ret/a retained a'], 'retained messages (the cleared one stays cleared)');
			const f = await client(v, { clientId: 'forgetful', clean: false });
			eq(f.connack.sessionPresent, false, 'a clean session was not kept');
		});
	}
}

test('persist_inflight_dup_v311', async () => {
	if (BROKER !== 'weft') return;
	const conf = store();
	await startBroker(conf);
	let c = await raw();
	await c.send(connectPacket({ version: 4, clientId: 'slow', clean: false }));
	await c.send(subscribePacket(1, 'inf/#', 1));
	await until(() => c.packets.length >= 2, 3000, 'CONNACK and SUBACK');
	const pub = await client(4);
	await pub.publishAsync('inf/x', 'not acked', { qos: 1 });
	await until(() => c.of(PUBLISH).length >= 1, 3000, 'the PUBLISH');
	const first = c.of(PUBLISH)[0];
	const pid = first.body.readUInt16BE(2 + 'inf/x'.length);
	c.close(); // never acknowledged
	await crashBroker();
	await startBroker(conf);
	c = await raw();
	await c.send(connectPacket({ version: 4, clientId: 'slow', clean: false }));
	await until(() => c.of(PUBLISH).length >= 1, 3000, 'the PUBLISH again');
	const again = c.of(PUBLISH)[0];
	assert(again.flags & 8, 'sent again with DUP');
	eq(again.body.readUInt16BE(2 + 'inf/x'.length), pid, 'with the same packet id');
	eq(again.body.subarray(4 + 'inf/x'.length).toString(), 'not acked', 'the same message');
	c.close();
});

// The crash test: kill -9 under QoS 1 load, five times; every acknowledged message arrives.
test('persist_crash_zero_loss', async () => {
	if (BROKER !== 'weft') return;
	const conf = store();
	const acked = new Set(), received = new Set();
	const kills = 5;
	let seq = 0, sent = 0;
	await startBroker(conf);
	const subscriber = async (first) => {
		const s = await client(4, { clientId: 'crash-sub', clean: false });
		s.on('message', (t, p) => received.add(Number(p.toString())));
		if (first) await s.subscribeAsync('crash/#', { qos: 1 });
		return s;
	};
	await subscriber(true);
	for (let k = 0; k < kills; k++) {
		if (k) {
			await startBroker(conf);
			await subscriber(false);
		}
		const p = await client(4, { clientId: `crash-pub-${k}` });
		let live = true, inflight = 0;
		p.on('close', () => { live = false; });
		const pump = async () => {
			while (live) {
				if (inflight >= 32) { await sleep(1); continue; }
				const n = ++seq;
				inflight++;
				sent++;
				p.publish('crash/t', String(n), { qos: 1 }, (err) => {
					inflight--;
					if (!err) acked.add(n);
				});
				if (n % 16 === 0) await sleep(0);
			}
		};
		const pumping = pump();
		await sleep(200 + Math.floor(Math.random() * 400));
		await crashBroker();
		await until(() => !live, 3000, 'the publisher to see the broker gone');
		await pumping;
	}
	await startBroker(conf);
	await subscriber(false);
	const missing = () => [...acked].filter((n) => !received.has(n));
	await until(() => missing().length === 0, 10000, 'every acknowledged message').catch(() => {});
	console.log(`${kills} kills under QoS 1 load: ${sent} published, ${acked.size} acknowledged, ` +
		`${received.size} received, ${missing().length} acknowledged but lost`);
	assert(acked.size > 100, `enough acknowledged messages to mean something (${acked.size})`);
	eq(missing().length, 0, 'acknowledged messages lost');
});

// Messages that expire while queued, or are acknowledged, leave nothing in the database.
test('persist_expired_forgotten_v5', async () => {
	if (BROKER !== 'weft') return;
	const conf = store();
	await startBroker(conf);
	const persistent = { clean: false, properties: { sessionExpiryInterval: 3600 } };
	let sub = await client(5, { clientId: 'exp', ...persistent });
	await sub.subscribeAsync('exp/#', { qos: 1 });
	sub.end(true);
	await sleep(100);
	const pub = await client(5);
	for (let i = 0; i < 3; i++)
		await pub.publishAsync('exp/short', `gone ${i}`, { qos: 1, properties: { messageExpiryInterval: 1 } });
	await pub.publishAsync('exp/long', 'kept', { qos: 1 });
	await sleep(1300);
	sub = await client(5, { clientId: 'exp', ...persistent });
	await until(() => sub.messages.length >= 1, 3000, 'the message that did not expire');
	await sleep(300);
	eq(got(sub), ['exp/long kept'], 'expired messages are not delivered');
	const wrong = await stopBroker();
	if (wrong) throw new Error(wrong);
	if (existsSync('/usr/bin/sqlite3')) {
		const db = path.join(conf.persistence_location, 'weft-mqtt.db');
		const r = await run('sqlite3', [db, 'SELECT (SELECT count(*) FROM queue), (SELECT count(*) FROM msgs)']);
		eq(r.stdout.trim(), '0|0', `queued deliveries and messages left in the database (${r.stderr})`);
	} else {
		console.log('the database check skipped: sqlite3 is not installed');
	}
	await startBroker(conf);
});
