// run.mjs - lists and runs the end-to-end tests: `node run.mjs --list` prints their names,
// `node run.mjs NAME` runs one (its own broker, its own clients) and exits 0 on success.
// After the test body, the broker must still be running (no input may bring it down), and then
// stop on SIGTERM with exit status 0 and no sanitizer report (in sanitizer builds).
import { existsSync } from 'node:fs';
import { tests, closeAll, stopBroker, brokerAlive, BROKER } from './lib.mjs';
import './cli.mjs';
import './core.mjs';
import './v5.mjs';
import './raw.mjs';
import './security.mjs';
import './ws.mjs';
import './tls.mjs';
import './persist.mjs';
import './metrics.mjs';
import './limits.mjs';

const arg = process.argv[2];
if (!arg || arg === '--list') {
	console.log([...tests.keys()].join('\n'));
	process.exit(0);
}
const fn = tests.get(arg);
if (!fn) {
	console.error(`no test ${arg}`);
	process.exit(2);
}
// The mosquitto_pub/mosquitto_sub tests need those tools (Debian: mosquitto-clients).
const have = (tool) => process.env.PATH.split(':').some((d) => existsSync(`${d}/${tool}`));
if (arg.startsWith('cli_') && !(have('mosquitto_pub') && have('mosquitto_sub'))) {
	console.log(`${arg}: skipped: mosquitto_pub/mosquitto_sub are not installed (Debian: mosquitto-clients)`);
	process.exit(0);
}
const limit = setTimeout(() => {
	console.error(`${arg}: timed out after 20 s`);
	process.exit(1);
}, 20000);
let ok = false;
try {
	await fn();
	if (!brokerAlive()) throw new Error(`the broker (${BROKER}) is not running at the end of the test`);
	ok = true;
} catch (e) {
	console.error(`${arg} against ${BROKER}: ${e.stack || e}`);
} finally {
	await closeAll().catch(() => {});
	const wrong = await stopBroker().catch((e) => String(e));
	if (wrong) {
		console.error(`${arg} against ${BROKER}: ${wrong}`);
		ok = false;
	}
	clearTimeout(limit);
}
process.exit(ok ? 0 : 1);
