// raw.mjs - end-to-end tests that write MQTT packets byte by byte (node's net module), for what
// well-behaved client libraries will not send: CONNACK return/reason codes and malformed input.
//
// Covers, for 3.1.1 and 5.0: CONNACK codes for an unsupported protocol version (0x01, or 0x84
// in 5.0 form), an unknown protocol name (closed), an empty client id with a persistent session
// in 3.1.1 (0x02), a client id that is not UTF-8 in 5.0 (0x85, or closed), an assigned client
// identifier in 5.0, anonymous clients refused (0x05 /
// 0x87); CONNECT with its reserved flag set; malformed packets (a remaining length over four
// bytes, PUBLISH before CONNECT, a second CONNECT, SUBSCRIBE with wrong fixed-header flags,
// PUBLISH at QoS 3, a wildcard in a PUBLISH topic, invalid UTF-8 in a topic, an unknown 5.0
// property, a topic alias over the maximum); a client that sends half a packet and stops, and
// keep-alive enforcement (closed after 1.5 times the keep-alive); a subscriber that stops
// reading while 30 MB of QoS 0 messages come for it (others go on; the broker's memory grows by
// less than 24 MiB: it drops or bounds, it does not buffer it all); the receive maximum (no more
// unacknowledged QoS 1 messages in flight to the client than it allows); a message over the
// broker's message_size_limit. In every malformed case the offending client is disconnected
// (in 5.0 any DISCONNECT it gets carries a reason code of 0x80 or more) while another client
// goes on publishing and receiving, and the broker keeps running (run.mjs checks).
// Against mosquitto 2.0.11: all pass but two, where mosquitto deviates from the specification:
// keepalive_enforced_* (it drops a silent client after about 5 s, not 1.5 x a keep-alive of
// 1 s: it checks keep-alives every few seconds) and receive_maximum_v5 (with a Receive Maximum
// of 2, one PUBACK lets it send two more: three in flight, MQTT-3.3.4-9).
import {
	test, skip, startBroker, client, raw, until, eq, assert, sleep, connectPacket, subscribePacket,
	publishPacket, packet, str, u16, u32, varint, bystanders, brokerRssKb, brokerSanitized, CONNACK,
	PUBLISH, PUBACK, DISCONNECT, BROKER,
} from './lib.mjs';

const tags = { 4: 'v311', 5: 'v5' };

// The CONNACK's code: byte 1 of its body in both versions.
const connackCode = (c) => c.of(CONNACK)[0]?.body[1];

async function connected(version, opts = {}) {
	const c = await raw();
	await c.send(connectPacket({ version, ...opts }));
	await until(() => c.of(CONNACK).length || c.closed, 3000, 'CONNACK');
	eq(connackCode(c), 0, 'CONNACK accepted');
	return c;
}

// A healthy pair of clients that must keep working whatever the others send.
async function expectDropped(c, version, what) {
	await until(() => c.closed, 3000, `the broker to close the connection after ${what}`);
	if (version === 5)
		for (const d of c.of(DISCONNECT))
			assert(d.body.length === 0 || d.body[0] >= 0x80, `DISCONNECT reason 0x${d.body[0]?.toString(16)} is an error`);
}

for (const v of [4, 5]) {
	const tag = tags[v];

	test(`connack_bad_protocol_version_${tag}`, async () => {
		await startBroker();
		const c = await raw();
		await c.send(connectPacket({ version: v === 4 ? 7 : 6, clientId: 'badver' }));
		await until(() => c.closed, 3000, 'the connection to close');
		const code = connackCode(c);
		assert(code === 0x01 || code === 0x84, `CONNACK unacceptable protocol version (got ${code})`);
	});

	test(`connack_bad_protocol_name_${tag}`, async () => {
		await startBroker();
		const c = await raw();
		await c.send(connectPacket({ version: v, protocolName: 'MQTX' }));
		await until(() => c.closed, 3000, 'the connection to close');
		assert(!c.of(CONNACK).some((p) => p.body[1] === 0), 'no CONNACK accepting it');
	});

	test(`connack_not_authorized_${tag}`, async () => {
		await startBroker({ allow_anonymous: 'false' });
		const c = await raw();
		await c.send(connectPacket({ version: v, clientId: 'anon' }));
		await until(() => c.closed, 3000, 'the connection to close');
		eq(connackCode(c), v === 4 ? 0x05 : 0x87, 'CONNACK not authorized');
	});

	test(`connect_reserved_flag_${tag}`, async () => {
		await startBroker();
		const ok = await bystanders(v);
		const c = await raw();
		await c.send(connectPacket({ version: v, flags: 0x03 })); // clean session + reserved bit
		await expectDropped(c, v, 'CONNECT with the reserved flag');
		assert(!c.of(CONNACK).some((p) => p.body[1] === 0), 'not accepted');
		await ok('reserved flag');
	});

	test(`malformed_remaining_length_${tag}`, async () => {
		await startBroker();
		const ok = await bystanders(v);
		const c = await connected(v);
		await c.send(Buffer.from([0x30, 0xff, 0xff, 0xff, 0xff, 0x7f]));
		await expectDropped(c, v, 'a five-byte remaining length');
		await ok('bad remaining length');
	});

	test(`malformed_publish_before_connect_${tag}`, async () => {
		await startBroker();
		const ok = await bystanders(v);
		const c = await raw();
		await c.send(publishPacket('ok/t', 'sneaky', { version: v }));
		await expectDropped(c, v, 'PUBLISH before CONNECT');
		await ok('publish before connect');
		await sleep(100);
	});

	test(`malformed_second_connect_${tag}`, async () => {
		await startBroker();
		const ok = await bystanders(v);
		const c = await connected(v);
		await c.send(connectPacket({ version: v, clientId: 'again' }));
		await expectDropped(c, v, 'a second CONNECT');
		await ok('second connect');
	});

	test(`malformed_subscribe_flags_${tag}`, async () => {
		await startBroker();
		const ok = await bystanders(v);
		const c = await connected(v);
		const sub = subscribePacket(1, 'ok/t', 1, v);
		sub[0] = 0x80; // SUBSCRIBE's fixed-header flags must be 0010
		await c.send(sub);
		await expectDropped(c, v, 'SUBSCRIBE with flags 0000');
		await ok('subscribe flags');
	});

	test(`malformed_publish_qos3_${tag}`, async () => {
		await startBroker();
		const ok = await bystanders(v);
		const c = await connected(v);
		const pub = publishPacket('ok/t', 'q3', { qos: 1, version: v });
		pub[0] = 0x36; // QoS bits 11
		await c.send(pub);
		await expectDropped(c, v, 'PUBLISH at QoS 3');
		await ok('qos 3');
	});

	test(`malformed_publish_wildcard_topic_${tag}`, async () => {
		await startBroker();
		const ok = await bystanders(v);
		const c = await connected(v);
		await c.send(publishPacket('ok/+', 'wild', { qos: 1, version: v }));
		await expectDropped(c, v, 'a wildcard in a PUBLISH topic');
		await ok('wildcard topic');
	});

	test(`malformed_utf8_topic_${tag}`, async () => {
		await startBroker();
		const ok = await bystanders(v);
		const c = await connected(v);
		const topic = Buffer.from([0x6f, 0x6b, 0x2f, 0xc0, 0x80]); // "ok/" + overlong NUL
		const parts = [u16(topic.length), topic, u16(1)];
		if (v === 5) parts.push(varint(0));
		parts.push(Buffer.from('bad'));
		await c.send(packet(3, 2, Buffer.concat(parts)));
		await expectDropped(c, v, 'invalid UTF-8 in a topic');
		await ok('bad utf-8');
	});

	test(`half_packet_then_silence_${tag}`, async () => {
		await startBroker();
		const ok = await bystanders(v);
		const c = await connected(v, { keepalive: 1 });
		const pub = publishPacket('ok/t', 'x'.repeat(100), { qos: 1, version: v });
		await c.send(pub.subarray(0, 40)); // and nothing more
		const t0 = Date.now();
		await ok('half a packet (meanwhile)');
		// Within 1.5 x the keep-alive, by the specification; 7 s allows for mosquitto, which
		// checks keep-alives every 5 s (keepalive_enforced holds brokers to the 1.5 s).
		await until(() => c.closed, 7000, 'the broker to drop the stalled client');
		console.error(`  dropped after ${Date.now() - t0} ms`);
		await ok('half a packet');
	});

	test(`keepalive_enforced_${tag}`, async () => {
		await startBroker();
		const c = await connected(v, { keepalive: 1 });
		const t0 = Date.now();
		await until(() => c.closed, 7000, 'the broker to drop the silent client');
		const dt = Date.now() - t0;
		assert(dt >= 900 && dt < 3000, `dropped after ${dt} ms: 1.5 x a keep-alive of 1 s (and a margin)`);
	});

	test(`slow_subscriber_qos0_${tag}`, async () => {
		const b = await startBroker();
		const rss = () => brokerRssKb(b);
		const ok = await bystanders(v);
		const slow = await connected(v, { clientId: 'slow' });
		await slow.send(subscribePacket(1, 'slow/t', 0, v));
		await until(() => slow.of(9).length, 3000, 'SUBACK');
		slow.sock.pause(); // reads nothing more: the broker's writes to it back up
		const p = await client(v);
		const rss0 = rss(), payload = Buffer.alloc(1000, 120);
		for (let i = 0; i < 30000; i++) { // 30 MB at QoS 0
			p.publish('slow/t', payload, { qos: 0 });
			if (i % 1000 === 999) await sleep(1);
		}
		await ok('30 MB of QoS 0 for a subscriber that does not read');
		const grown = rss() - rss0;
		if (!brokerSanitized(b))
			assert(grown < 24 * 1024, `the broker holds at most part of what the slow subscriber cannot take (RSS grew ${grown} KiB)`);
	});

	test(`message_size_limit_${tag}`, async () => {
		await startBroker({ message_size_limit: 1000 });
		const ok = await bystanders(v);
		const s = await client(v);
		await s.subscribeAsync('big/t', { qos: 1 });
		// Refused either way: PUBACK (in 5.0 with an error reason) and not delivered, or the
		// connection closed (in 5.0 DISCONNECT 0x95, packet too large).
		const c = await connected(v);
		await c.send(publishPacket('big/t', 'x'.repeat(5000), { qos: 1, id: 7, version: v }));
		await c.send(publishPacket('big/t', 'small', { qos: 1, id: 8, version: v }));
		await until(() => c.closed || c.of(PUBACK).length >= 2, 3000, 'PUBACKs or the connection closed');
		await sleep(300);
		eq(s.messages.map((m) => m.payload), c.closed ? [] : ['small'], 'the large message is not delivered');
		if (v === 5 && !c.closed) assert(c.of(PUBACK)[0].body[2] >= 0x80, 'PUBACK with an error reason');
		await ok('a message over the limit');
	});
}

test('connack_empty_client_id_v311', async () => {
	await startBroker();
	const c = await raw();
	await c.send(connectPacket({ version: 4, clientId: '', clean: false }));
	await until(() => c.closed, 3000, 'the connection to close');
	eq(connackCode(c), 0x02, 'CONNACK identifier rejected');
	const d = await raw();
	await d.send(connectPacket({ version: 4, clientId: '', clean: true }));
	await until(() => d.of(CONNACK).length, 3000, 'CONNACK');
	eq(connackCode(d), 0, 'an empty id with a clean session is accepted');
});

test('connack_bad_client_id_v5', async () => {
	await startBroker();
	const c = await raw();
	const id = Buffer.from([0x61, 0xff, 0x62]); // not UTF-8
	const body = Buffer.concat([str('MQTT'), Buffer.from([5, 2]), u16(60), varint(0), u16(id.length), id]);
	await c.send(packet(1, 0, body));
	await until(() => c.closed, 3000, 'the connection to close');
	const code = connackCode(c);
	assert(code === undefined || code === 0x85 || code === 0x81 || code === 0x80,
		`no CONNACK, or CONNACK client identifier not valid / malformed (got ${code})`);
});

// The Assigned Client Identifier of a 5.0 CONNACK's body, or null (the properties walked by
// type: one-byte, two- and four-byte integers, strings and string pairs).
function assignedId(body) {
	let i = 2, len = 0, shift = 0;
	for (;;) {
		const b = body[i++];
		len += (b & 127) << shift;
		shift += 7;
		if (!(b & 128)) break;
	}
	const end = i + len;
	const size = { 0x24: 1, 0x25: 1, 0x28: 1, 0x29: 1, 0x2a: 1, 0x13: 2, 0x21: 2, 0x22: 2, 0x11: 4, 0x27: 4 };
	while (i < end) {
		const id = body[i++];
		if (size[id]) { i += size[id]; continue; }
		const n = body.readUInt16BE(i);
		if (id === 0x12) return body.subarray(i + 2, i + 2 + n).toString();
		i += 2 + n;
		if (id === 0x26) i += 2 + body.readUInt16BE(i); // a user property: a pair
	}
	return null;
}

// An assigned client id must not be guessable: knowing one (ours) must not tell another (a
// victim's, whose session a client with clean start 0 would resume). 128 random bits in hex,
// and two ids in a row share no more bits than chance does.
test('connack_assigned_client_id_v5', async () => {
	await startBroker();
	const ids = [];
	for (let k = 0; k < 2; k++) {
		const c = await raw();
		await c.send(connectPacket({ version: 5, clientId: '' }));
		await until(() => c.of(CONNACK).length, 3000, 'CONNACK');
		const body = c.of(CONNACK)[0].body;
		eq(body[1], 0, 'accepted');
		const id = assignedId(body);
		assert(id !== null, 'CONNACK carries an Assigned Client Identifier property');
		ids.push(id);
	}
	if (BROKER !== 'weft') return;
	for (const id of ids) assert(/^auto-[0-9a-f]{32}$/.test(id), `an id of 128 bits in hex (${id})`);
	let differ = 0;
	for (let j = 5; j < ids[0].length; j++) {
		let x = parseInt(ids[0][j], 16) ^ parseInt(ids[1][j], 16);
		for (; x; x &= x - 1) differ++;
	}
	// random ids differ in 64 of 128 bits on average; fewer than 32 has odds below 10^-8
	assert(differ >= 32, `two assigned ids differ in ${differ} of 128 bits (${ids.join(', ')})`);
});

// The ids of a 5.0 PUBLISH's properties, from its body.
function publishPropIds(p) {
	const b = p.body;
	let i = 2 + b.readUInt16BE(0) + (((p.flags >> 1) & 3) ? 2 : 0);
	let len = 0, shift = 0;
	for (;;) {
		const x = b[i++];
		len += (x & 127) << shift;
		shift += 7;
		if (!(x & 128)) break;
	}
	const end = i + len, ids = [];
	const size = { 0x01: 1, 0x02: 4, 0x18: 4, 0x23: 2 };
	while (i < end) {
		const id = b[i++];
		ids.push(id);
		if (size[id]) i += size[id];
		else if (id === 0x0b) while (b[i++] & 128);
		else {
			i += 2 + b.readUInt16BE(i);
			if (id === 0x26) i += 2 + b.readUInt16BE(i);
		}
	}
	return ids;
}

// A will's PUBLISH carries only the will properties that belong in a PUBLISH: not the Will
// Delay Interval (0x18), which a client may take for a protocol error (Python paho-mqtt's
// network thread dies on it), and the Message Expiry Interval as what is left of it.
test('will_publish_properties_v5', async () => {
	await startBroker();
	const sub = await raw();
	await sub.send(connectPacket({ version: 5, clientId: 'will-watch' }));
	await sub.send(subscribePacket(1, 'will/t', 1, 5));
	await until(() => sub.of(9).length, 3000, 'SUBACK');
	const willProps = Buffer.concat([
		Buffer.from([0x18]), u32(0), // will delay interval: 0
		Buffer.from([0x01, 1]), // payload format: UTF-8
		Buffer.from([0x02]), u32(600), // message expiry interval
		Buffer.from([0x03]), str('text/plain'), // content type
		Buffer.from([0x08]), str('reply/here'), // response topic
		Buffer.from([0x09]), str('corr'), // correlation data
		Buffer.from([0x26]), str('k'), str('v'), // a user property
	]);
	const body = Buffer.concat([str('MQTT'), Buffer.from([5, 0x0e]), u16(60), varint(0), str('will-owner'),
		varint(willProps.length), willProps, str('will/t'), str('gone')]);
	const w = await raw();
	await w.send(packet(1, 0, body));
	await until(() => w.of(CONNACK).length, 3000, 'CONNACK');
	w.close(); // no DISCONNECT: the will goes out
	await until(() => sub.of(PUBLISH).length, 3000, 'the will');
	const ids = publishPropIds(sub.of(PUBLISH)[0]);
	eq(ids.filter((id) => id !== 0x02).sort((a, b) => a - b), [0x01, 0x03, 0x08, 0x09, 0x26],
		'the will\'s PUBLISH properties (message expiry aside)');
	assert(!ids.includes(0x18), 'no Will Delay Interval in a PUBLISH');
});

// UNSUBSCRIBE of filters nobody could have subscribed ("$share/g" without its filter took the
// broker down): each answered, 5.0 with 0x8F (topic filter invalid), 3.1.1 with a plain
// UNSUBACK, and the broker goes on. (mosquitto 2.0 closes the connection instead, which the
// protocol allows too.)
test('unsubscribe_invalid_filters', async () => {
	if (BROKER === 'mosquitto') skip('mosquitto closes the connection for an invalid filter');
	await startBroker();
	const ok = await bystanders(5);
	const bad = ['$share/g', '$share/', '$share//t', '$share/g/', 'a/#/b', 'x+'];
	for (const version of [4, 5]) {
		const c = await connected(version);
		const body = [u16(7)];
		if (version === 5) body.push(varint(0));
		for (const f of bad) body.push(str(f));
		await c.send(packet(10, 2, Buffer.concat(body)));
		await until(() => c.of(11).length || c.closed, 3000, `${version}: UNSUBACK`);
		const ack = c.of(11)[0];
		assert(ack, `${version}: an UNSUBACK, not a close`);
		if (version === 5)
			eq([...ack.body.subarray(3)], bad.map(() => 0x8F), '5.0: each filter invalid');
		else
			eq(ack.body.length, 2, '3.1.1: the packet id only');
	}
	await ok('unsubscribe of invalid filters');
});

test('malformed_unknown_property_v5', async () => {
	await startBroker();
	const ok = await bystanders(5);
	const c = await connected(5);
	await c.send(publishPacket('ok/t', 'prop', { qos: 1, version: 5, props: Buffer.from([0x7f, 0x00]) }));
	await expectDropped(c, 5, 'an unknown property');
	await ok('unknown property');
});

test('topic_alias_over_maximum_v5', async () => {
	await startBroker();
	const ok = await bystanders(5);
	const c = await connected(5);
	// Topic Alias 0xffff: over any maximum the broker can have announced.
	await c.send(publishPacket('ok/t', 'alias', { qos: 1, version: 5, props: Buffer.from([0x23, 0xff, 0xff]) }));
	await expectDropped(c, 5, 'a topic alias over the maximum');
	const d = c.of(DISCONNECT)[0];
	if (d) eq(d.body[0], 0x94, 'DISCONNECT reason: topic alias invalid');
	await ok('topic alias');
});

test('receive_maximum_v5', async () => {
	await startBroker();
	// Receive Maximum 2: at most two QoS 1 PUBLISHes unacknowledged at once.
	const c = await connected(5, { clientId: 'rm', props: Buffer.from([0x21, 0x00, 0x02]) });
	await c.send(subscribePacket(1, 'rm/t', 1, 5));
	await until(() => c.of(9).length, 3000, 'SUBACK');
	const p = await client(5);
	for (let i = 0; i < 6; i++) await p.publishAsync('rm/t', `m${i}`, { qos: 1 });
	await sleep(300);
	eq(c.of(PUBLISH).length, 2, 'two messages in flight, no more');
	const id = (pk) => pk.body.readUInt16BE(2 + pk.body.readUInt16BE(0));
	await c.send(packet(4, 0, u16(id(c.of(PUBLISH)[0]))));
	await until(() => c.of(PUBLISH).length >= 3, 3000, 'a third message once one is acknowledged');
	await sleep(200);
	eq(c.of(PUBLISH).length, 3, 'still no more than two in flight');
	for (const pk of c.of(PUBLISH).slice(1)) await c.send(packet(4, 0, u16(id(pk))));
	await until(() => c.of(PUBLISH).length >= 5, 3000, 'two more');
	for (const pk of c.of(PUBLISH).slice(3)) await c.send(packet(4, 0, u16(id(pk))));
	await until(() => c.of(PUBLISH).length >= 6, 3000, 'the last');
	assert(!c.closed, 'still connected');
	void str; void PUBACK;
});
