// twice.mjs - every end-to-end test, twice over, against one broker that runs the whole time:
// a broker runs for months, and what one client leaves behind (a session, a subscription, a
// packet id, a mark) must not change what the next one gets. Tests that need a configuration
// of their own, or stop or kill their broker, skip here (they run on their own broker in
// run.mjs). At the end the broker must still run, and stop on SIGTERM with exit status 0 and
// no sanitizer report. Prints a line per failure and a summary; exits 0 when nothing failed.
import { tests, closeAll, startBroker, stopBroker, shareBroker, brokerAlive, Skip, have } from './lib.mjs';
import './all.mjs';

const LIMIT = 20000; // ms per test, as run.mjs allows
const only = process.env.ONLY ? new RegExp(process.env.ONLY) : null; // to look at a few
const b = await startBroker();
shareBroker(b);
const failed = [];
let passed = 0, skipped = 0;
for (const pass of [1, 2]) {
	for (const [name, fn] of tests) {
		if (only && !only.test(name)) continue;
		if (name.startsWith('cli_') && !(have('mosquitto_pub') && have('mosquitto_sub'))) {
			skipped++;
			continue;
		}
		let timer;
		try {
			await Promise.race([fn(), new Promise((_, reject) => {
				timer = setTimeout(() => reject(new Error(`timed out after ${LIMIT / 1000} s`)), LIMIT);
			})]);
			if (!brokerAlive()) throw new Error('the shared broker is not running');
			passed++;
		} catch (e) {
			if (e instanceof Skip) skipped++;
			else failed.push(`pass ${pass}: ${name}: ${e.stack || e}`);
		} finally {
			clearTimeout(timer);
			await closeAll().catch(() => {});
		}
		if (!brokerAlive()) break;
	}
}
shareBroker(null);
const wrong = await stopBroker().catch((e) => String(e));
for (const f of failed) console.error(`FAIL ${f}`);
if (wrong) console.error(`the shared broker: ${wrong}`);
console.log(`one broker, every test twice: ${passed} passed, ${failed.length} failed, ${skipped} skipped (each pass)`);
process.exit(failed.length || wrong ? 1 : 0);
