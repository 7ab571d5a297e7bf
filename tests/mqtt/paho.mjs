// paho.mjs - end-to-end tests with Python paho-mqtt (Debian python3-paho-mqtt), a third client
// library beside MQTT.js and mosquitto's: it checks what it receives more strictly than they do
// (a property that does not belong in a packet kills its network thread).
import { existsSync } from 'node:fs';
import { test, startBroker, run, eq, skip } from './lib.mjs';

const python = '/usr/bin/python3';
const script = new URL('./will_paho.py', import.meta.url).pathname;

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
