// run.mjs - lists and runs the end-to-end tests: `node run.mjs --list` prints their names,
// `node run.mjs NAME` runs one (its own broker, its own clients) and exits 0 on success.
// After the test body, the broker must still be running (no input may bring it down), and then
// stop on SIGTERM with exit status 0 and no sanitizer report (in sanitizer builds).
import { tests, closeAll, stopBroker, brokerAlive, BROKER, Skip, have } from './lib.mjs';
import './all.mjs';

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
if (arg.startsWith('cli_') && !(have('mosquitto_pub') && have('mosquitto_sub'))) {
	console.log('mosquitto_pub/mosquitto_sub are not installed (Debian: mosquitto-clients)');
	process.exit(77);
}
const limit = setTimeout(() => {
	console.error(`${arg}: timed out after 20 s`);
	process.exit(1);
}, 20000);
let ok = false, skipped = null;
try {
	await fn();
	if (!brokerAlive()) throw new Error(`the broker (${BROKER}) is not running at the end of the test`);
	ok = true;
} catch (e) {
	if (e instanceof Skip) skipped = e.message;
	else console.error(`${arg} against ${BROKER}: ${e.stack || e}`);
} finally {
	await closeAll().catch(() => {});
	const wrong = await stopBroker().catch((e) => String(e));
	if (wrong) {
		console.error(`${arg} against ${BROKER}: ${wrong}`);
		ok = false;
		skipped = null; // a broker that ended badly fails the test, skipped or not
	}
	clearTimeout(limit);
}
if (skipped !== null) {
	console.log(skipped); // the last line: tests/run.sh prints it as the reason
	process.exit(77);
}
process.exit(ok ? 0 : 1);
