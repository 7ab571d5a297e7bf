// all.mjs - every end-to-end test module; importing it fills lib.mjs's `tests` (run.mjs runs one
// test, twice.mjs all of them on one broker).
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
import './paho.mjs';
