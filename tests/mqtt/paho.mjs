// paho.mjs - end-to-end tests with Python paho-mqtt (Debian python3-paho-mqtt), a third client
// library beside MQTT.js and mosquitto's: it checks what it receives more strictly than they do
// (a property that does not belong in a packet kills its network thread).
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test, startBroker, run, eq, skip, ownBrokers, BROKER } from './lib.mjs';

const python = '/usr/bin/python3';
const script = new URL('./will_paho.py', import.meta.url).pathname;
const q2k = new URL('./qos2_kill9_paho.py', import.meta.url).pathname;

async function havePaho() {
	if (!existsSync(python)) return false;
	const r = await run(python, ['-c', 'import paho.mqtt.client'], { timeout: 10000 }).catch(() => ({ code: 1 }));
	return r.code === 0;
}

// A will sent with a Will Delay Interval reaches a paho 5.0 subscriber, which then still gets
// the next message (it did not, when the will's PUBLISH carried property 0x18).
test('paho_will_then_more_v5', async () => {
	if (!(await havePaho())) skip('Python paho-mqtt is not installed (Debian: python3-paho-mqtt)');
	const b = await startBroker();
	const r = await run(python, [script, String(b.port)], { timeout: 18000 });
	eq(r.code, 0, `will_paho.py: ${r.stdout}${r.stderr}`);
});

// QoS 2 through kill -9 with paho on both ends, persistent sessions, the subscriber subscribing
// again on every reconnect (qos2_kill9_paho.py, 4 kills here): every message completed for the
// publisher reaches the subscriber once. (With PUB_CLEAN=1, by hand, the script shows the
// duplicates a clean-session paho publisher makes by resending; see the script.)
test('paho_qos2_kill9_v311', async () => {
	if (!(await havePaho())) skip('Python paho-mqtt is not installed (Debian: python3-paho-mqtt)');
	if (BROKER !== 'weft') skip('kills weft-mqtt and starts it again on its database');
	ownBrokers();
	const bin = process.env.WEFT_MQTT || new URL('../../build/bin/weft-mqtt', import.meta.url).pathname;
	const dir = mkdtempSync(path.join(os.tmpdir(), 'mqtt-e2e-q2k-'));
	try {
		const r = await run(python, [q2k, bin, dir, '4'], { timeout: 19000 });
		eq(r.code, 0, `qos2_kill9_paho.py: ${r.stdout}${r.stderr}`);
	} finally {
		rmSync(dir, { recursive: true, force: true });
	}
});
