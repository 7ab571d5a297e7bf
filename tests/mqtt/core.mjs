// core.mjs - end-to-end tests with MQTT.js of what MQTT 3.1.1 and 5.0 share, each run for both.
//
// Covers: publish/subscribe at QoS 0, 1 and 2 (order, granted QoS); unsubscribe; QoS 2
// exactly-once across connections cut in the middle of the flow (a proxy between client and
// broker drops the packet and both sockets: the publisher's PUBREC, its PUBREL, the
// subscriber's PUBREC, the PUBREL to the subscriber; both clients reconnect to their sessions
// and finish the flows); persistent sessions (session present, QoS 1 and 2 queued while away,
// a clean session starts empty); $SYS topics not matched by # or +/...; $SYS/broker statistics
// (uptime, clients, messages and bytes, named and written as mosquitto does); overlapping
// subscriptions (one copy at the highest QoS); shared subscriptions (each message to exactly one
// member of the group, while a plain subscriber gets them all).
// Against mosquitto 2.0.11: all pass but overlapping_subscriptions_v311, where mosquitto deviates
// from the specification: to a 3.1.1 client it sends one copy at the QoS of one matching
// subscription (here 0), not at the highest (MQTT-3.3.5-1); the test fails there. To a 5.0
// client it sends a copy per matching subscription, which 5.0 allows besides the one at the
// highest QoS (weft-mqtt sends one, as the issue asks), so against mosquitto that test checks
// only the copy at the highest QoS.
import { test, startBroker, client, until, eq, assert, sleep, proxy, BROKER } from './lib.mjs';

const msgs = (c) => c.messages.map((m) => `${m.topic} ${m.packet.qos} ${m.payload}`);

for (const v of [4, 5]) {
	const tag = v === 4 ? 'v311' : 'v5';
	const persist = v === 5 ? { properties: { sessionExpiryInterval: 300 } } : {};

	test(`qos012_${tag}`, async () => {
		await startBroker();
		const s = await client(v);
		const granted = await s.subscribeAsync({ 'q/2': { qos: 2 }, 'q/1': { qos: 1 }, 'q/0': { qos: 0 } });
		eq(granted.map((g) => g.qos), [2, 1, 0], 'granted QoS');
		const p = await client(v);
		for (let i = 0; i < 5; i++)
			for (const q of [0, 1, 2]) await p.publishAsync('q/2', `${q}.${i}`, { qos: q });
		await p.publishAsync('q/1', 'two at one', { qos: 2 });
		await p.publishAsync('q/0', 'one at zero', { qos: 1 });
		await until(() => s.messages.length >= 17, 3000, '17 messages');
		// Order holds within each QoS (MQTT.js hands a QoS 2 message over only at PUBREL).
		for (const q of [0, 1, 2])
			eq(msgs(s).filter((m) => m.startsWith(`q/2 ${q} `)), [0, 1, 2, 3, 4].map((i) => `q/2 ${q} ${q}.${i}`),
				`QoS ${q} messages in order`);
		eq(msgs(s).filter((m) => !m.startsWith('q/2')), ['q/1 1 two at one', 'q/0 0 one at zero'],
			'each at the lower of the two QoS');
	});

	test(`unsubscribe_${tag}`, async () => {
		await startBroker();
		const s = await client(v);
		await s.subscribeAsync(['u/a', 'u/b'], { qos: 1 });
		const p = await client(v);
		await p.publishAsync('u/a', 'a1', { qos: 1 });
		await s.unsubscribeAsync('u/a');
		await p.publishAsync('u/a', 'a2', { qos: 1 });
		await p.publishAsync('u/b', 'b1', { qos: 1 });
		await until(() => s.messages.length >= 2, 3000, 'two messages');
		await sleep(100);
		eq(msgs(s), ['u/a 1 a1', 'u/b 1 b1'], 'nothing on u/a after unsubscribing');
	});

	test(`qos2_exactly_once_cut_${tag}`, async () => {
		const b = await startBroker();
		const pp = await proxy(b.port), sp = await proxy(b.port);
		for (const id of [`xs-${tag}`, `xp-${tag}`]) // a clean start: no session of an earlier run
			await (await client(v, { clientId: id, clean: true })).endAsync();
		const opts = { clean: false, reconnectPeriod: 50, ...persist };
		const s = await client(v, { clientId: `xs-${tag}`, ...opts }, sp.port);
		await s.subscribeAsync('x/t', { qos: 2 });
		const p = await client(v, { clientId: `xp-${tag}`, ...opts }, pp.port);
		const PUBREC = 5, PUBREL = 6;
		const cuts = { 2: [pp, 'down', PUBREC], 4: [pp, 'up', PUBREL], 6: [sp, 'up', PUBREC], 8: [sp, 'down', PUBREL] };
		for (let i = 0; i < 12; i++) {
			if (cuts[i]) {
				// the publisher's PUBCOMP can come before the subscriber's flow has passed
				// the previous cut: arming again would replace it, not add one
				const px = cuts[i][0];
				await until(() => !px.armed, 5000, 'the previous cut on the same proxy');
				px.cut({ dir: cuts[i][1], type: cuts[i][2] });
			}
			await p.publishAsync('x/t', `m${i}`, { qos: 2 });
		}
		await until(() => !pp.armed && !sp.armed, 5000, 'the last cuts');
		await until(() => s.messages.length >= 12, 5000, 'twelve messages');
		await sleep(300); // time for a duplicate to show
		eq(pp.cuts + sp.cuts, 4, 'connections cut');
		const got = s.messages.map((m) => m.payload).sort((a, c) => a.slice(1) - c.slice(1));
		eq(got, [...Array(12).keys()].map((i) => `m${i}`), 'each message exactly once');
		pp.close();
		sp.close();
	});

	test(`persistent_session_${tag}`, async () => {
		await startBroker();
		let s = await client(v, { clientId: `ps-${tag}`, clean: false, ...persist });
		eq(s.connack.sessionPresent, false, 'no session at first');
		await s.subscribeAsync({ 'ps/1': { qos: 1 }, 'ps/2': { qos: 2 }, 'ps/0': { qos: 0 } });
		await s.endAsync();
		const p = await client(v);
		for (const q of [1, 2]) await p.publishAsync(`ps/${q}`, `away${q}`, { qos: q });
		s = await client(v, { clientId: `ps-${tag}`, clean: false, ...persist });
		eq(s.connack.sessionPresent, true, 'session present');
		await until(() => s.messages.length >= 2, 3000, 'the queued messages');
		eq(msgs(s).sort(), ['ps/1 1 away1', 'ps/2 2 away2'], 'QoS 1 and 2 queued while away');
		await p.publishAsync('ps/0', 'back', { qos: 0 });
		await until(() => s.messages.length >= 3, 3000, 'the subscription kept');
		await s.endAsync();
		// A clean session replaces the stored one: nothing queued, no subscription.
		await p.publishAsync('ps/1', 'dropped', { qos: 1 });
		const c = await client(v, { clientId: `ps-${tag}`, clean: true });
		eq(c.connack.sessionPresent, false, 'clean session: no session present');
		await p.publishAsync('ps/1', 'unsubscribed', { qos: 1 });
		await sleep(300);
		eq(c.messages.length, 0, 'a clean session has neither queued messages nor subscriptions');
	});

	test(`sys_not_matched_by_wildcards_${tag}`, async () => {
		await startBroker({ sys_interval: 1 });
		const all = await client(v), plus = await client(v), sys = await client(v);
		await all.subscribeAsync('#', { qos: 0 });
		await plus.subscribeAsync('+/broker/#', { qos: 0 });
		await sys.subscribeAsync('$SYS/#', { qos: 0 });
		const p = await client(v);
		await p.publishAsync('n/x', 'plain', { qos: 1 });
		await until(() => sys.messages.some((m) => m.topic.startsWith('$SYS/broker/')), 3000, 'a $SYS/broker message');
		await until(() => all.messages.length >= 1, 3000, 'the plain message');
		await sleep(1200); // one more $SYS interval
		eq(all.messages.map((m) => m.topic), ['n/x'], '# matches no $SYS topic');
		eq(plus.messages.length, 0, '+/broker/# matches no $SYS topic');
	});

	test(`sys_statistics_${tag}`, async () => {
		await startBroker({ sys_interval: 1 });
		const c = await client(v);
		await c.subscribeAsync('$SYS/broker/#', { qos: 0 });
		const want = ['$SYS/broker/uptime', '$SYS/broker/clients/connected', '$SYS/broker/messages/received',
			'$SYS/broker/messages/sent', '$SYS/broker/bytes/received', '$SYS/broker/bytes/sent'];
		const seen = () => new Set(c.messages.map((m) => m.topic));
		await until(() => want.every((t) => seen().has(t)), 3000, `${want.join(', ')} (have ${[...seen()].join(', ')})`);
		const last = (t) => c.messages.filter((m) => m.topic === t).at(-1).payload;
		// The value retained at subscribe time may predate this client: wait for the next.
		await until(() => Number.parseInt(last('$SYS/broker/clients/connected'), 10) >= 1, 2500,
			'clients/connected to count this client');
		assert(/^\d+ seconds$/.test(last('$SYS/broker/uptime')), `uptime as mosquitto writes it: "${last('$SYS/broker/uptime')}"`);
	});

	test(`overlapping_subscriptions_${tag}`, async () => {
		await startBroker();
		const s = await client(v);
		// MQTT.js hands a QoS 2 message to 'message' only at PUBREL, so the order of s.messages
		// across QoS levels is the client's race; the order the broker sent is the wire's.
		const wire = [];
		s.on('packetreceive', (pk) => {
			if (pk.cmd === 'publish') wire.push(`${pk.topic} ${pk.qos} ${pk.payload}`);
		});
		await s.subscribeAsync({ 'o/#': { qos: 1 }, 'o/+': { qos: 2 }, 'o/a': { qos: 0 } });
		const p = await client(v);
		await p.publishAsync('o/a', 'three match', { qos: 2 });
		await p.publishAsync('o/b/c', 'one matches', { qos: 2 });
		await p.publishAsync('o/b', 'two match', { qos: 1 });
		await until(() => s.messages.length >= 3, 3000, 'three messages');
		await sleep(300);
		const want = ['o/a 2 three match', 'o/b/c 1 one matches', 'o/b 1 two match'];
		for (const w of want) assert(msgs(s).includes(w), `a copy at the highest QoS granted: ${w} in ${msgs(s)}`);
		if (BROKER !== 'mosquitto') // mosquitto sends a copy per subscription, which the specs allow
			eq(wire, want, 'one copy each, in publication order');
	});

	test(`shared_subscriptions_${tag}`, async () => {
		await startBroker();
		const members = [];
		for (let i = 0; i < 3; i++) {
			const m = await client(v);
			await m.subscribeAsync('$share/g1/sh/#', { qos: 1 });
			members.push(m);
		}
		const plain = await client(v);
		await plain.subscribeAsync('sh/#', { qos: 1 });
		const p = await client(v);
		for (let i = 0; i < 30; i++) await p.publishAsync(`sh/${i % 3}`, `m${i}`, { qos: 1 });
		await until(() => plain.messages.length >= 30 && members.reduce((n, m) => n + m.messages.length, 0) >= 30,
			3000, 'thirty messages to the plain subscriber and to the group');
		await sleep(300);
		const got = members.flatMap((m) => m.messages.map((x) => x.payload)).sort();
		eq(got, [...Array(30).keys()].map((i) => `m${i}`).sort(), 'each message to exactly one member');
		eq(plain.messages.length, 30, 'the plain subscriber gets every message');
		assert(members.every((m) => m.messages.every((x) => x.topic.startsWith('sh/'))), 'topics without $share');
	});
}
