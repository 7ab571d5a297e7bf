// cli.mjs - end-to-end tests with the Debian mosquitto-clients tools, mosquitto_pub and
// mosquitto_sub, for MQTT 3.1.1 and 5.0: each feature below as those tools express it.
//
// Covers: publish/subscribe at QoS 0, 1 and 2 (delivered at the lower of the two QoS);
// retained messages (set, replace, clear with an empty payload, delivered on subscribe with the
// retain flag); wildcards + and #; the last will (sent when the client dies, not when it
// disconnects cleanly); persistent sessions (QoS 1 messages queued while the client is away,
// delivered when it reconnects); in 5.0, properties through the broker (user properties in
// order, response topic, correlation data, content type, message expiry, the subscription
// identifier).
// Against mosquitto 2.0.11: all pass.
//
// mosquitto_sub gives no sign that its subscription is in place, so each subscriber also
// subscribes to a topic holding a retained "sync" message and the test publishes only once
// that message is printed.
import { test, startBroker, run, start, until, eq, assert, sleep } from './lib.mjs';

const V = { 4: 'mqttv311', 5: 'mqttv5' };
let seq = 0;

async function pub(b, version, args) {
	const r = await run('mosquitto_pub', ['-h', '127.0.0.1', '-p', String(b.port), '-V', V[version], ...args]);
	if (r.code !== 0) throw new Error(`mosquitto_pub ${args.join(' ')}: exit ${r.code}: ${r.stderr}`);
}

// mosquitto_sub with args, subscribed (the sync message seen) when this resolves.
async function sub(b, version, args) {
	const sync = `sync/${process.pid}/${seq++}`;
	await pub(b, version, ['-t', sync, '-r', '-m', 'sync']);
	const s = start('mosquitto_sub', ['-h', '127.0.0.1', '-p', String(b.port), '-V', V[version],
		'-t', sync, '-F', '%t %q %r %p', ...args]);
	await until(() => s.out().includes(sync), 3000, `mosquitto_sub ${args.join(' ')} to subscribe (${s.err()})`);
	s.lines = () => s.out().split('\n').filter((l) => l && !l.startsWith('sync/'));
	return s;
}

for (const v of [4, 5]) {
	const tag = v === 4 ? 'v311' : 'v5';

	test(`cli_qos012_${tag}`, async () => {
		const b = await startBroker();
		const s1 = await sub(b, v, ['-t', 'q/#', '-q', '2']);
		const s0 = await sub(b, v, ['-t', 'q/#', '-q', '0']);
		for (const q of [0, 1, 2]) await pub(b, v, ['-t', `q/${q}`, '-q', String(q), '-m', `m${q}`]);
		await until(() => s1.lines().length >= 3 && s0.lines().length >= 3, 3000, 'three messages each');
		await sleep(100);
		eq(s1.lines(), ['q/0 0 0 m0', 'q/1 1 0 m1', 'q/2 2 0 m2'], 'subscriber at QoS 2 (topic qos retain payload)');
		eq(s0.lines(), ['q/0 0 0 m0', 'q/1 0 0 m1', 'q/2 0 0 m2'], 'subscriber at QoS 0 gets QoS 0');
		s1.proc.kill();
		s0.proc.kill();
	});

	test(`cli_retained_${tag}`, async () => {
		const b = await startBroker();
		await pub(b, v, ['-t', 'r/t', '-r', '-q', '1', '-m', 'one']);
		await pub(b, v, ['-t', 'r/t', '-r', '-q', '1', '-m', 'two']);
		let r = await run('mosquitto_sub', ['-p', String(b.port), '-V', V[v], '-t', 'r/#', '-F', '%t %r %p', '-C', '1', '-W', '3']);
		eq(r.stdout.trim(), 'r/t 1 two', 'the replaced retained message, retain flag set');
		// On subscribe, the retained message with the retain flag; then a live retained
		// publish with the flag clear.
		const s = await sub(b, v, ['-t', 'r/#']);
		await pub(b, v, ['-t', 'r/t', '-r', '-m', 'three']);
		await until(() => s.lines().length >= 2, 3000, 'the live message');
		eq(s.lines(), ['r/t 0 1 two', 'r/t 0 0 three'], 'retained on subscribe, then live');
		s.proc.kill();
		await pub(b, v, ['-t', 'r/t', '-r', '-n']); // empty payload: clears
		r = await run('mosquitto_sub', ['-p', String(b.port), '-V', V[v], '-t', 'r/#', '--retained-only', '-W', '1'], { timeout: 4000 });
		eq(r.stdout, '', 'nothing retained after the clear');
	});

	test(`cli_wildcards_${tag}`, async () => {
		const b = await startBroker();
		const s = await sub(b, v, ['-t', 'a/+/c', '-t', 'x/#', '-t', '+/z', '-q', '1']);
		for (const t of ['a/b/c', 'a/b/d', 'a/b/c/d', 'a//c', 'x', 'x/y/z', 'y', 'y/z', 'z', 'b/y/z'])
			await pub(b, v, ['-t', t, '-q', '1', '-m', t]);
		await pub(b, v, ['-t', 'x/end', '-q', '1', '-m', 'end']);
		await until(() => s.lines().some((l) => l.endsWith(' end')), 3000, 'the last message');
		const got = s.lines().map((l) => l.split(' ')[0]);
		eq(got, ['a/b/c', 'a//c', 'x', 'x/y/z', 'y/z', 'x/end'], 'topics matched by a/+/c, x/# and +/z');
		s.proc.kill();
	});

	test(`cli_will_${tag}`, async () => {
		const b = await startBroker();
		const w = await sub(b, v, ['-t', 'will/#', '-q', '1']);
		const dies = await sub(b, v, ['-t', 'any', '--will-topic', 'will/dies', '--will-payload', 'gone', '--will-qos', '1']);
		const quits = await sub(b, v, ['-t', 'quit', '-C', '2', '--will-topic', 'will/quits', '--will-payload', 'gone']);
		await pub(b, v, ['-t', 'quit', '-m', 'bye']); // quits: one message, then a clean DISCONNECT
		await quits.done;
		dies.proc.kill('SIGKILL'); // dies: its socket closes without DISCONNECT
		await until(() => w.lines().length >= 1, 3000, 'the will');
		await sleep(200);
		eq(w.lines(), ['will/dies 1 0 gone'], 'the will of the killed client only');
		w.proc.kill();
	});

	test(`cli_persistent_session_${tag}`, async () => {
		const b = await startBroker();
		const id = `persist-${tag}`;
		const keep = v === 5 ? ['-x', '60'] : [];
		// a clean start first: the session a run before left on this broker goes
		const r0 = await run('mosquitto_sub', ['-p', String(b.port), '-V', V[v], '-i', id, '-t', 'p/t', '-E']);
		assert(r0.code === 0, `mosquitto_sub -E exit ${r0.code}: ${r0.stderr}`);
		const s = await sub(b, v, ['-i', id, '-c', ...keep, '-t', 'p/t', '-q', '1', '-C', '2']);
		await pub(b, v, ['-t', 'p/t', '-q', '1', '-m', 'live']);
		await s.done; // got sync and "live" and disconnected cleanly; the session stays
		for (const m of ['q1', 'q2', 'q3']) await pub(b, v, ['-t', 'p/t', '-q', '1', '-m', m]);
		const r = await run('mosquitto_sub', ['-p', String(b.port), '-V', V[v], '-i', id, '-c', ...keep,
			'-t', 'p/t', '-q', '1', '-F', '%t %q %p', '-C', '3', '-W', '3'], { timeout: 5000 });
		eq(r.stdout.trim().split('\n'), ['p/t 1 q1', 'p/t 1 q2', 'p/t 1 q3'], 'the messages queued while away');
		assert(r.code === 0, `mosquitto_sub exit ${r.code}`);
	});
}

test('cli_properties_v5', async () => {
	const b = await startBroker();
	const s = await sub(b, 5, ['-t', 'pp/#', '-D', 'subscribe', 'subscription-identifier', '7',
		'-F', '%t|%p|%P|%R|%D|%C|%E|%S']);
	await pub(b, 5, ['-t', 'pp/x', '-m', 'hello', '-D', 'publish', 'user-property', 'k1', 'v1',
		'-D', 'publish', 'user-property', 'k2', 'v2', '-D', 'publish', 'response-topic', 'rt/x',
		'-D', 'publish', 'correlation-data', 'abc', '-D', 'publish', 'content-type', 'text/plain',
		'-D', 'publish', 'message-expiry-interval', '60']);
	await until(() => s.lines().length >= 1, 3000, 'the message');
	const [topic, payload, user, resp, corr, ctype, expiry, subid] = s.lines()[0].split('|');
	eq([topic, payload, user, resp, corr, ctype, subid], ['pp/x', 'hello', 'k1:v1 k2:v2', 'rt/x', 'abc', 'text/plain', '7'],
		'topic, payload, user properties, response topic, correlation data, content type, subscription id');
	assert(Number(expiry) >= 59 && Number(expiry) <= 60, `message expiry interval forwarded (${expiry})`);
	s.proc.kill();
});
