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
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test, startBroker, crashBroker, stopBroker, client, raw, connectPacket, subscribePacket,
	publishPacket, packet, u16, run, until, eq, assert, sleep, BROKER, PUBLISH, PUBREC, PUBREL,
	PUBCOMP, skip } from './lib.mjs';

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
			if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
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

// A raw 3.1.1 client with a persistent session, subscribed to filter at qos.
async function rawSubscriber(id, filter, qos) {
	const c = await raw();
	await c.send(connectPacket({ version: 4, clientId: id, clean: false }));
	await c.send(subscribePacket(1, filter, qos));
	await until(() => c.packets.length >= 2, 3000, 'CONNACK and SUBACK');
	return c;
}

test('persist_inflight_dup_v311', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	await startBroker(conf);
	let c = await rawSubscriber('slow', 'inf/#', 1);
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

// The crash test: kill -9 under QoS 1 load, five times; every acknowledged message arrives at
// each of two persistent subscribers (the messages are stored once for both: the pinning of
// shared messages is on the path).
test('persist_crash_zero_loss', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	const acked = new Set(), received = [new Set(), new Set()];
	const kills = 5;
	let seq = 0, sent = 0;
	const rounds = []; // the first number of each round
	let subs = [];
	await startBroker(conf);
	const subscriber = async (first) => {
		subs = [];
		for (let i = 0; i < 2; i++) {
			const s = await client(4, { clientId: `crash-sub-${i}`, clean: false });
			record(s, received[i]);
			if (first) await s.subscribeAsync('crash/#', { qos: 1 });
			subs.push(s);
		}
	};
	await subscriber(true);
	for (let k = 0; k < kills; k++) {
		if (k) {
			await startBroker(conf);
			await subscriber(false);
		}
		rounds.push(seq + 1);
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
	const missing = () => [...acked].filter((n) => !received[0].has(n) || !received[1].has(n));
	await until(() => missing().length === 0, 10000, 'every acknowledged message').catch(() => {});
	console.log(`${kills} kills under QoS 1 load: ${sent} published, ${acked.size} acknowledged, ` +
		`${received[0].size} and ${received[1].size} received, ${missing().length} acknowledged but lost`);
	assert(acked.size > 100, `enough acknowledged messages to mean something (${acked.size})`);
	if (missing().length) await explainLoss(missing(), received, rounds, subs, conf);
	eq(missing().length, 0, 'acknowledged messages lost');
});

// Every number subscriber client c receives goes into set, including those that came in the
// same read as its CONNACK: MQTT.js handles them before `await client()` returns, so c.messages
// has them and a handler attached now would miss them.
function record(c, set) {
	for (const m of c.messages) set.add(Number(m.payload));
	c.on('message', (t, p) => set.add(Number(p.toString())));
}

// What became of acknowledged messages a subscriber lacks: does a new connection of its
// session get them (stuck in the broker, not lost), and are they still rows in the store?
async function explainLoss(lost, received, rounds, subs, conf) {
	const round = (n) => rounds.findLastIndex((first) => first <= n);
	for (const n of lost)
		console.log(`lost: ${n} (round ${round(n)}), subscriber 0 ${received[0].has(n) ? 'has' : 'lacks'}` +
			` it, subscriber 1 ${received[1].has(n) ? 'has' : 'lacks'} it`);
	for (const s of subs) s.end(true);
	await sleep(100);
	for (let i = 0; i < 2; i++)
		record(await client(4, { clientId: `crash-sub-${i}`, clean: false }), received[i]);
	await sleep(2000);
	for (const n of lost)
		console.log(`lost: ${n} after the subscribers reconnected: ` +
			`${received[0].has(n) && received[1].has(n) ? 'delivered (it was stuck)' : 'still missing'}`);
	const wrong = await stopBroker();
	if (wrong) console.log(wrong);
	const db = path.join(conf.persistence_location, 'weft-mqtt.db');
	if (!existsSync('/usr/bin/sqlite3')) return;
	for (const n of lost) {
		const r = await run('sqlite3', [db, 'SELECT q.id, q.seq, q.pid, q.state FROM queue q JOIN msgs m ' +
			`USING(mid) WHERE m.payload = CAST('${n}' AS BLOB)`]);
		console.log(`lost: ${n} in the store: ${r.stdout.trim() || 'no queue row'} ${r.stderr}`);
	}
}

// Messages that expire while queued, or are acknowledged, leave nothing in the database.
test('persist_expired_forgotten_v5', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
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

// ---- what each queued delivery and each session carries through a restart ---------------------

const restartBy = async (how, conf) => {
	if (how === 'restart') {
		const wrong = await stopBroker();
		if (wrong) throw new Error(wrong);
	} else {
		await crashBroker();
	}
	await startBroker(conf);
};
const subIds = (m) => [].concat(m.packet.properties?.subscriptionIdentifier ?? []).sort((a, b) => a - b);
const P5 = { clean: false, properties: { sessionExpiryInterval: 3600 } };

// A queued message keeps, per receiver, the RETAIN flag it gets (retain-as-published) and the
// subscription identifiers of the subscriptions it matched, and its own properties.
for (const how of ['restart', 'kill9']) {
	test(`persist_delivery_fields_${how}_v5`, async () => {
		if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
		const conf = store();
		await startBroker(conf);
		let s = await client(5, { clientId: 'fields', ...P5 });
		await s.subscribeAsync({ 'rap/yes': { qos: 1, rap: true }, 'rap/no': { qos: 1, rap: false } });
		await s.subscribeAsync('si/#', { qos: 1, properties: { subscriptionIdentifier: 5 } });
		await s.subscribeAsync('si/+', { qos: 2, properties: { subscriptionIdentifier: 268435455 } });
		s.end(true);
		await sleep(100);
		const p = await client(5);
		const props = { userProperties: { a: '1', b: ['2', '3'] }, contentType: 'text/plain',
			responseTopic: 'r/t', correlationData: Buffer.from([1, 2, 0, 255]), payloadFormatIndicator: true };
		await p.publishAsync('rap/yes', 'y', { qos: 1, retain: true, properties: props });
		await p.publishAsync('rap/no', 'n', { qos: 1, retain: true });
		await p.publishAsync('si/a', 'two ids', { qos: 2 });
		await p.publishAsync('si/b/c', 'one id', { qos: 1, properties: { messageExpiryInterval: 3600 } });
		await restartBy(how, conf);
		s = await client(5, { clientId: 'fields', ...P5 });
		eq(s.connack.sessionPresent, true, 'the session is present');
		await until(() => s.messages.length >= 4, 5000, 'the queued messages');
		await sleep(200);
		// (MQTT.js hands a QoS 2 message over at its PUBREL: after the QoS 1 behind it)
		const byTopic = s.messages.slice().sort((x, y) => (x.topic < y.topic ? -1 : 1));
		const seen = byTopic.map((m) => `${m.topic} ${m.payload} retain=${m.packet.retain} qos=${m.packet.qos}`);
		eq(seen, ['rap/no n retain=false qos=1', 'rap/yes y retain=true qos=1', 'si/a two ids retain=false qos=2',
			'si/b/c one id retain=false qos=1'], 'RETAIN flags (retain-as-published) and QoS');
		eq(byTopic.map(subIds), [[], [], [5, 268435455], [5]], 'subscription identifiers');
		const pr = byTopic[1].packet.properties;
		eq([pr.userProperties, pr.contentType, pr.responseTopic, [...pr.correlationData], pr.payloadFormatIndicator],
			[props.userProperties, 'text/plain', 'r/t', [1, 2, 0, 255], true], 'the message properties');
		const left = byTopic[3].packet.properties.messageExpiryInterval;
		assert(left > 3590 && left <= 3600, `message expiry interval left: ${left}`);
		// and live messages through the restored subscriptions
		const p2 = await client(5);
		await p2.publishAsync('rap/yes', 'live', { qos: 1, retain: true });
		await p2.publishAsync('si/z', 'live ids', { qos: 1 });
		await until(() => s.messages.length >= 6, 3000, 'the live messages');
		eq(s.messages.slice(4).map((m) => `${m.payload} ${m.packet.retain} ${subIds(m)}`),
			['live true ', 'live ids false 5,268435455'], 'restored subscription options and identifiers');
	});
}

// Subscription options and shared subscriptions through kill -9: no-local, retain handling
// (the subscription exists after the restart), $share groups (one member per message).
test('persist_subscription_options_v5', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	await startBroker(conf);
	const p = await client(5);
	await p.publishAsync('rh/t', 'kept', { qos: 1, retain: true });
	let a = await client(5, { clientId: 'opt-a', ...P5 });
	await a.subscribeAsync('nl/t', { qos: 1, nl: true });
	await a.subscribeAsync('rh/#', { qos: 1, rh: 1 });
	await a.subscribeAsync('$share/g/sh/#', { qos: 1, properties: { subscriptionIdentifier: 9 } });
	let b = await client(5, { clientId: 'opt-b', ...P5 });
	await b.subscribeAsync('$share/g/sh/#', { qos: 1 });
	await until(() => a.messages.length >= 1, 3000, 'the retained message on the first subscribe');
	await crashBroker();
	await startBroker(conf);
	a = await client(5, { clientId: 'opt-a', ...P5 });
	b = await client(5, { clientId: 'opt-b', ...P5 });
	await a.subscribeAsync('rh/#', { qos: 1, rh: 1 }); // exists: no retained message this time
	await a.publishAsync('nl/t', 'own', { qos: 1 });
	const q = await client(5);
	await q.publishAsync('nl/t', 'other', { qos: 1 });
	for (let i = 0; i < 6; i++) await q.publishAsync('sh/x', `s${i}`, { qos: 1 });
	await until(() => a.messages.length + b.messages.length >= 7, 3000, 'the messages');
	await sleep(300);
	eq(got(a).filter((m) => !m.startsWith('sh/')), ['nl/t other'], 'no-local kept, retain handling 1 kept');
	const shared = [...got(a), ...got(b)].filter((m) => m.startsWith('sh/')).sort();
	eq(shared, ['sh/x s0', 'sh/x s1', 'sh/x s2', 'sh/x s3', 'sh/x s4', 'sh/x s5'], 'each shared message once');
	assert(a.messages.filter((m) => m.topic === 'sh/x').every((m) => subIds(m).join() === '9'),
		'the shared subscription keeps its identifier');
});

// Session expiry counts from the disconnection, across the broker's downtime; a session that
// was connected at a crash counts from the restart. The protocol level comes back too.
test('persist_session_expiry_v5', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	await startBroker(conf);
	const short = await client(5, { clientId: 'short', clean: false, properties: { sessionExpiryInterval: 1 } });
	const long = await client(5, { clientId: 'long', ...P5 });
	await client(5, { clientId: 'up', clean: false, properties: { sessionExpiryInterval: 2 } });
	await client(4, { clientId: 'old', clean: false });
	short.end(true);
	long.end(true);
	await sleep(100);
	await crashBroker(); // 'up' and 'old' were connected
	await sleep(2100); // times are stored in whole seconds, rounded up: 1 s lasts up to 2
	await startBroker(conf);
	const s = await client(5, { clientId: 'short', clean: false, properties: { sessionExpiryInterval: 1 } });
	eq(s.connack.sessionPresent, false, 'expired while the broker was down');
	const l = await client(5, { clientId: 'long', ...P5 });
	eq(l.connack.sessionPresent, true, 'a long expiry: present');
	const u = await client(5, { clientId: 'up', clean: false, properties: { sessionExpiryInterval: 2 } });
	eq(u.connack.sessionPresent, true, 'connected at the crash: its expiry counts from the restart');
	const o = await client(4, { clientId: 'old', clean: false });
	eq(o.connack.sessionPresent, true, 'a 3.1.1 session never expires');
});

// ---- wills -----------------------------------------------------------------------------------

// Clients connected when the broker is killed ended without DISCONNECT: their wills are
// published after the restart, after the delay (counted from the restart); one whose client
// comes back in time is not; a retained will stays retained through a further restart.
test('persist_will_after_crash_v5', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	await startBroker(conf);
	let w = await client(5, { clientId: 'watcher', ...P5 });
	await w.subscribeAsync('will/#', { qos: 1 });
	const will = (t, delay, retain = false) => ({ topic: t, payload: `${t} died`, qos: 1, retain,
		properties: { willDelayInterval: delay } });
	await client(5, { clientId: 'wa', will: will('will/a', 1, true), ...P5 });
	await client(4, { clientId: 'wb', clean: false, will: { topic: 'will/b', payload: 'will/b died', qos: 1 } });
	await client(5, { clientId: 'wc', will: will('will/c', 2), ...P5 });
	await client(5, { clientId: 'wd', will: will('will/d', 0), clean: true }); // not persistent
	await crashBroker();
	const t0 = Date.now();
	await startBroker(conf);
	await client(5, { clientId: 'wc', ...P5 }); // back in time: no will
	w = await client(5, { clientId: 'watcher', ...P5 });
	await until(() => w.messages.length >= 1, 3000, 'the 3.1.1 will (no delay)');
	eq(got(w), ['will/b will/b died'], 'the will without a delay at once');
	let at = 0;
	w.on('message', (t) => { if (t === 'will/a') at = Date.now(); });
	await until(() => w.messages.length >= 2, 3000, 'the delayed will');
	const dt = at - t0;
	assert(dt >= 900, `the will with a 1 s delay came ${dt} ms after the restart began`);
	await sleep(2200);
	eq(got(w), ['will/b will/b died', 'will/a will/a died'], 'no will for the client that came back, none for a clean session');
	const wrong = await stopBroker();
	if (wrong) throw new Error(wrong);
	await startBroker(conf);
	const r = await client(5);
	await r.subscribeAsync('will/#', { qos: 1 });
	await until(() => r.messages.length >= 1, 3000, 'the retained will');
	await sleep(200);
	eq(got(r), ['will/a will/a died'], 'the retained will survived a restart');
});

// A will waiting for its delay when the broker stops (SIGTERM) or crashes is published when
// it is due, after the restart.
for (const how of ['restart', 'kill9']) {
	test(`persist_will_pending_${how}_v5`, async () => {
		if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
		const conf = store();
		await startBroker(conf);
		const w = await client(5, { clientId: 'watcher', ...P5 });
		await w.subscribeAsync('will/#', { qos: 1 });
		const d = await client(5, { clientId: 'wp', ...P5,
			will: { topic: 'will/p', payload: 'gone', qos: 1, properties: { willDelayInterval: 2 } } });
		d.stream.destroy(); // no DISCONNECT: the will waits for its 2 s
		const t0 = Date.now();
		await sleep(300);
		await restartBy(how, conf);
		const w2 = await client(5, { clientId: 'watcher', ...P5 });
		let at = 0;
		w2.on('message', () => { at = at || Date.now(); });
		await until(() => w2.messages.length >= 1, 4000, 'the will');
		const dt = at - t0;
		assert(dt >= 1900, `the will came ${dt} ms after the connection ended, before its 2 s delay`);
		// due times are kept in whole seconds, rounded up, and the reaper looks every 200 ms
		assert(dt < 3500, `the will came ${dt} ms after the connection ended`);
		eq(got(w2), ['will/p gone'], 'the will');
	});
}

// ---- QoS 2 and expiry across a crash --------------------------------------------------------

// With commits slowed down, kill the broker right after a PUBCOMP: the packet id it released
// must be forgotten on disk too, or the client's next message with that id is taken for a
// resend of the old one and never delivered.
test('persist_qos2_pubcomp_durable', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	process.env.WEFT_MQTT_STORE_COMMIT_DELAY_MS = '300';
	try {
		await startBroker(conf);
	} finally {
		delete process.env.WEFT_MQTT_STORE_COMMIT_DELAY_MS;
	}
	let s = await client(4, { clientId: 'q2sub', clean: false });
	await s.subscribeAsync('q2/#', { qos: 2 });
	s.end(true); // away: what it is sent is queued
	let c = await raw();
	await c.send(connectPacket({ version: 4, clientId: 'q2pub', clean: false }));
	await c.send(publishPacket('q2/t', 'first', { qos: 2, id: 7 }));
	await until(() => c.of(PUBREC).length >= 1, 3000, 'PUBREC');
	await c.send(packet(PUBREL, 2, u16(7)));
	await until(() => c.of(PUBCOMP).length >= 1, 3000, 'PUBCOMP');
	await crashBroker();
	await startBroker(conf);
	s = await client(4, { clientId: 'q2sub', clean: false });
	c = await raw();
	await c.send(connectPacket({ version: 4, clientId: 'q2pub', clean: false }));
	await c.send(publishPacket('q2/t', 'second', { qos: 2, id: 7 }));
	await until(() => c.of(PUBREC).length >= 1, 3000, 'PUBREC');
	await c.send(packet(PUBREL, 2, u16(7)));
	await until(() => s.messages.length >= 2, 3000, 'both messages').catch(() => {});
	eq(got(s), ['q2/t first', 'q2/t second'], 'both QoS 2 messages, once each');
	c.close();
});

// A QoS 2 PUBLISH resent on a new connection while the first copy (from a connection that
// ended with an error before its batch was durable) is not on disk yet: its PUBREC must not
// go out before the first copy is durable, or a crash right after it loses the message. (It
// does not: the new connection's CONNECT writes the session, and its CONNACK waits for that
// write and so for every earlier one.)
test('persist_qos2_resend_durable', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	process.env.WEFT_MQTT_STORE_COMMIT_DELAY_MS = '400';
	try {
		await startBroker(conf);
	} finally {
		delete process.env.WEFT_MQTT_STORE_COMMIT_DELAY_MS;
	}
	let s = await client(4, { clientId: 'rsub', clean: false });
	await s.subscribeAsync('rs/#', { qos: 2 });
	s.end(true); // away: what it is sent is queued
	const c1 = await raw();
	// CONNECT, the PUBLISH, then a packet of a reserved type: the connection ends in the
	// same batch, without waiting for the store
	await c1.send(Buffer.concat([connectPacket({ version: 4, clientId: 'rpub', clean: false }),
		publishPacket('rs/t', 'only', { qos: 2, id: 9 }), Buffer.from([0, 0])]));
	await until(() => c1.closed, 3000, 'the broker to close the first connection');
	const c2 = await raw();
	await c2.send(connectPacket({ version: 4, clientId: 'rpub', clean: false }));
	await c2.send(Buffer.from(publishPacket('rs/t', 'only', { qos: 2, id: 9 }).map((b, i) => (i ? b : b | 8))));
	await until(() => c2.of(PUBREC).length >= 1, 3000, 'PUBREC for the resend');
	await crashBroker();
	await startBroker(conf);
	s = await client(4, { clientId: 'rsub', clean: false });
	await until(() => s.messages.length >= 1, 3000, 'the message').catch(() => {});
	await sleep(200);
	eq(got(s), ['rs/t only'], 'the message acknowledged with PUBREC, once');
	c2.close();
});

// Messages that expire while the broker is down are not delivered after the restart (neither
// queued ones not sent yet nor retained ones).
test('persist_expired_while_down_v5', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	await startBroker(conf);
	let s = await client(5, { clientId: 'exd', ...P5 });
	await s.subscribeAsync('ex/#', { qos: 1 });
	s.end(true);
	await sleep(100);
	const p = await client(5);
	await p.publishAsync('ex/a', 'gone', { qos: 1, properties: { messageExpiryInterval: 1 } });
	await p.publishAsync('ex/r', 'retained gone', { qos: 1, retain: true, properties: { messageExpiryInterval: 1 } });
	await p.publishAsync('ex/b', 'kept', { qos: 1 });
	const wrong = await stopBroker();
	if (wrong) throw new Error(wrong);
	await sleep(1600);
	await startBroker(conf);
	s = await client(5, { clientId: 'exd', ...P5 });
	const r = await client(5);
	await r.subscribeAsync('ex/#', { qos: 1 });
	await until(() => s.messages.length >= 1, 3000, 'the message that did not expire');
	await sleep(400);
	eq(got(s), ['ex/b kept'], 'expired queued messages are not delivered');
	eq(got(r), [], 'an expired retained message is not sent');
});

// ---- a message fanned out to many persistent sessions is stored once -----------------------

test('persist_fanout_stored_once', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	const db = path.join(conf.persistence_location, 'weft-mqtt.db');
	if (!existsSync('/usr/bin/sqlite3')) skip('the rows are counted with sqlite3, which is not installed (Debian: sqlite3)');
	// stops the broker; the rows in the database
	const count = async () => {
		const wrong = await stopBroker();
		if (wrong) throw new Error(wrong);
		const r = await run('sqlite3', [db, 'SELECT (SELECT count(*) FROM msgs), (SELECT count(*) FROM queue)']);
		return r.stdout.trim();
	};
	const N = 20, M = 50;
	await startBroker(conf);
	for (let i = 0; i < N; i++) {
		const s = await client(4, { clientId: `fan-${i}`, clean: false });
		await s.subscribeAsync('fan/t', { qos: 1 });
		s.end(true);
	}
	await sleep(100);
	const p = await client(4);
	for (let i = 0; i < M; i++) await p.publishAsync('fan/t', `m${i}`, { qos: 1 });
	eq(await count(), `${M}|${N * M}`, 'messages stored once, a queue row per session');
	await startBroker(conf);
	const subs = [];
	for (let i = 0; i < N; i++) subs.push(await client(4, { clientId: `fan-${i}`, clean: false }));
	const p2 = await client(4);
	for (let i = 0; i < M; i++) await p2.publishAsync('fan/t', `n${i}`, { qos: 1 }); // while online
	await until(() => subs.every((s) => s.messages.length >= 2 * M), 5000, 'every message to every session');
	await sleep(300);
	for (const s of subs) eq(s.messages.map((m) => m.payload).join(), [...Array(M).keys()].map((i) => `m${i}`)
		.concat([...Array(M).keys()].map((i) => `n${i}`)).join(), 'all messages, in order');
	eq(await count(), '0|0', 'nothing left once every session acknowledged');
	await startBroker(conf);
});

// With commits slowed down, kill the broker right after an UNSUBACK, and right after a
// CONNACK that says a clean session replaced a stored one: both must be true on disk.
const slowStart = async (conf, ms) => {
	process.env.WEFT_MQTT_STORE_COMMIT_DELAY_MS = String(ms);
	try {
		await startBroker(conf);
	} finally {
		delete process.env.WEFT_MQTT_STORE_COMMIT_DELAY_MS;
	}
};

test('persist_unsubscribe_durable', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	await slowStart(conf, 400);
	let s = await client(4, { clientId: 'unsub', clean: false });
	await s.subscribeAsync('un/#', { qos: 1 });
	await s.unsubscribeAsync('un/#');
	await crashBroker();
	await startBroker(conf);
	s = await client(4, { clientId: 'unsub', clean: false });
	const p = await client(4);
	await p.publishAsync('un/t', 'not for it', { qos: 1 });
	await sleep(400);
	eq(got(s), [], 'no message through a subscription removed before the crash');
});

test('persist_clean_takeover_durable', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	await slowStart(conf, 400);
	const s = await client(4, { clientId: 'tk', clean: false });
	await s.subscribeAsync('tk/#', { qos: 1 });
	s.end(true);
	await sleep(100);
	const c = await client(4, { clientId: 'tk', clean: true });
	eq(c.connack.sessionPresent, false, 'a clean session');
	await crashBroker();
	await startBroker(conf);
	const again = await client(4, { clientId: 'tk', clean: false });
	eq(again.connack.sessionPresent, false, 'the stored session is gone, as the CONNACK said');
});

// QoS 2 exactly once across a crash between PUBREC and PUBREL, both ways: a publisher that
// had its PUBREC resends the PUBLISH (DUP) after the restart and it is not delivered again; a
// subscriber that had sent its PUBREC gets the PUBREL again after the restart, not the message.
test('persist_qos2_exactly_once_across_crash', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	await startBroker(conf);
	let sub = await rawSubscriber('x2sub', 'x2/#', 2);
	let pub = await raw();
	await pub.send(connectPacket({ version: 4, clientId: 'x2pub', clean: false }));
	await pub.send(publishPacket('x2/t', 'once', { qos: 2, id: 5 }));
	await until(() => pub.of(PUBREC).length >= 1 && sub.of(PUBLISH).length >= 1, 3000, 'PUBREC, the PUBLISH');
	const spid = sub.of(PUBLISH)[0].body.readUInt16BE(2 + 'x2/t'.length);
	await sub.send(packet(PUBREC, 0, u16(spid)));
	await until(() => sub.of(PUBREL).length >= 1, 3000, 'PUBREL to the subscriber');
	await sleep(300); // the subscriber's PUBREC is on disk (the broker does not wait for it)
	await crashBroker();
	await startBroker(conf);
	pub = await raw();
	await pub.send(connectPacket({ version: 4, clientId: 'x2pub', clean: false }));
	await pub.send(Buffer.from(publishPacket('x2/t', 'once', { qos: 2, id: 5 }).map((b, i) => (i ? b : b | 8))));
	await until(() => pub.of(PUBREC).length >= 1, 3000, 'PUBREC for the resend');
	await pub.send(packet(PUBREL, 2, u16(5)));
	await until(() => pub.of(PUBCOMP).length >= 1, 3000, 'PUBCOMP');
	sub = await raw();
	await sub.send(connectPacket({ version: 4, clientId: 'x2sub', clean: false }));
	await until(() => sub.of(PUBREL).length >= 1, 3000, 'the PUBREL again');
	eq(sub.of(PUBREL)[0].body.readUInt16BE(0), spid, 'for the same packet id');
	await sub.send(packet(PUBCOMP, 0, u16(spid)));
	await sleep(400);
	eq(sub.of(PUBLISH).length, 0, 'the message is not sent again, nor its resend delivered');
	pub.close();
	sub.close();
});

// Session take-over while the old connection's write is pending: the new connection's CONNACK
// comes after that write is durable (the CONNECT's session write is later in the same order),
// so a crash right after it loses nothing the old connection published.
test('persist_takeover_pending_write', async () => {
	if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
	const conf = store();
	await slowStart(conf, 400);
	let s = await client(4, { clientId: 'tko-sub', clean: false });
	await s.subscribeAsync('tko/#', { qos: 1 });
	s.end(true);
	const c1 = await raw();
	await c1.send(Buffer.concat([connectPacket({ version: 4, clientId: 'tko', clean: false }),
		publishPacket('tko/t', 'pending', { qos: 1, id: 3 })]));
	await sleep(50);
	const c2 = await raw();
	await c2.send(connectPacket({ version: 4, clientId: 'tko', clean: false }));
	await until(() => c2.packets.some((p) => p.type === 2), 3000, 'the CONNACK of the take-over');
	await crashBroker();
	await startBroker(conf);
	s = await client(4, { clientId: 'tko-sub', clean: false });
	await until(() => s.messages.length >= 1, 3000, 'the message').catch(() => {});
	eq(got(s), ['tko/t pending'], 'the message published before the take-over');
	c1.close();
	c2.close();
});

// A session's owner is stored with it: after a restart, another user still cannot resume it.
for (const how of ['restart', 'kill9']) {
	test(`persist_session_owner_${how}_v5`, async () => {
		if (BROKER !== 'weft') skip('tests weft-mqtt\'s own store');
		const conf = store();
		const pw = path.join(conf.persistence_location, 'passwd');
		writeFileSync(pw, 'bob:bob-pw\nalice:alice-pw\n');
		Object.assign(conf, { password_file: pw, allow_plain_passwords: 'true', allow_anonymous: 'false' });
		await startBroker(conf);
		const keep = { clean: false, properties: { sessionExpiryInterval: 3600 } };
		const bob = await client(5, { clientId: 'bobsess', username: 'bob', password: 'bob-pw', ...keep });
		await bob.subscribeAsync('bob/q', { qos: 1 });
		await bob.endAsync();
		const other = await client(5, { clientId: 'pub', username: 'alice', password: 'alice-pw' });
		await other.publishAsync('bob/q', 'bob-private', { qos: 1 });
		await other.endAsync();
		if (how === 'restart') {
			const wrong = await stopBroker();
			if (wrong) throw new Error(wrong);
		} else {
			await crashBroker();
		}
		await startBroker(conf);
		let code = 0;
		await client(5, { clientId: 'bobsess', username: 'alice', password: 'alice-pw', ...keep })
			.catch((e) => { code = e.code; });
		eq(code, 0x87, "alice resuming bob's restored session");
		const back = await client(5, { clientId: 'bobsess', username: 'bob', password: 'bob-pw', ...keep });
		await until(() => back.messages.length >= 1, 3000, "bob's queued message");
		eq(got(back), ['bob/q bob-private'], 'bob gets it after the restart');
	});
}
