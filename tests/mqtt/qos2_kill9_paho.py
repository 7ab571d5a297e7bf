# qos2_kill9_paho.py BROKER DIR [KILLS] - QoS 2 through kill -9 with Python paho-mqtt 1.6
# (Debian python3-paho-mqtt) on both ends, as its users write them: a 3.1.1 subscriber with a
# persistent session (clean_session False) that subscribes again in on_connect, every time it
# connects, and a 3.1.1 publisher sending numbered QoS 2 messages, paho's default 20 in flight.
# The broker (BROKER, persistence in DIR) is killed with SIGKILL at a random moment KILLS times
# (default 10) and started again on the same database; paho reconnects by itself. At the end
# every message the publisher saw completed (PUBCOMP) must have reached the subscriber's
# on_message once, and none more than once. paho delivers a QoS 2 message when its PUBREL
# comes (and keeps the ids it holds across reconnects), so a duplicate is two whole flows.
#
# The publisher keeps its session too (clean_session False), which is what QoS 2 needs across
# a crash. With PUB_CLEAN=1 it has paho's default, a clean session.
#
# paho 1.6 itself sends some messages twice, and a broker must take the second for a new
# message (MQTT 4.3.3: a packet id is free once the receiver has its PUBREL; with a clean
# session the broker has discarded every id). The script tells those duplicates apart by
# paho's own log of what it sent:
# - a PUBLISH after its PUBREL. paho resets its messages' states before each reconnect
#   attempt (_messages_reconnect_reset_out): one awaiting PUBCOMP is to resend its PUBREL,
#   but if that attempt fails - the broker is still starting after the kill -, the next reset
#   turns it into a PUBLISH to send, with DUP 0. If the broker had the PUBREL on disk (its
#   PUBCOMP lost to the kill), the PUBLISH is a new message, delivered again. These are the
#   duplicates users reported (same payload, packet ids about 20 apart - paho's 20 in flight
#   -, neither DUP); they take a failed reconnect attempt, so a broker slow to restart.
# - with PUB_CLEAN=1, a PUBLISH resent (DUP) after reconnecting with a clean session, which
#   paho does for clean sessions too.
#
# Prints each duplicate (payload; packet id, DUP, RETAIN, round of each copy; what paho did),
# the first lost messages, and a summary line; exits 0 when no message was lost, none was
# delivered twice but for paho's second sends above, every flow finished and the broker's
# last exit (SIGTERM) was 0.
# (Not named paho.py: the script's folder comes first in sys.path, and would shadow paho.)
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt

broker_bin, workdir = sys.argv[1], sys.argv[2]
kills = int(sys.argv[3]) if len(sys.argv) > 3 else 10
pub_clean = os.environ.get("PUB_CLEAN") == "1"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


port = free_port()
conf = os.path.join(workdir, "weft-mqtt.conf")
with open(conf, "w") as f:
    # no limit on queued messages: one dropped for a full queue would count as lost here
    f.write(f"listener {port} 127.0.0.1\npersistence true\n"
            f"persistence_location {workdir}/store\nmax_queued_messages 0\n")
log = open(os.path.join(workdir, "broker.log"), "ab")
proc = None


def start():
    global proc
    proc = subprocess.Popen([broker_bin, "-c", conf], stderr=log)
    end = time.time() + 30
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"the broker exited with status {proc.returncode}")
            time.sleep(0.01)
    sys.exit("the broker did not listen")


lock = threading.Lock()
got = {}         # payload -> [(packet id, dup, retain, round)]
completed = set()
sent = {}        # paho's mid -> payload, until completed
early = set()    # mids completed before publisher() noted them
rel_sent = set()    # payloads paho sent PUBREL for
again = {}          # payload -> why paho sent its PUBLISH again as a new one (see above)
published = set()   # payloads paho sent a PUBLISH for
connects = 0        # CONNECTs the publisher sent
first_sent = {}     # payload -> the publisher's CONNECT count at its first PUBLISH
rnd = 0
subscribed = threading.Event()


def on_connect(c, userdata, flags, rc):
    if rc == 0:
        c.subscribe("q2/#", qos=2)  # every time, as the users' clients do


def on_message(c, userdata, m):
    with lock:
        got.setdefault(m.payload.decode(), []).append((m.mid, m.dup, m.retain, rnd))


def on_publish(c, userdata, mid):
    with lock:
        if mid in sent:
            completed.add(sent.pop(mid))
        else:
            early.add(mid)


def on_log(c, userdata, level, buf):
    """paho's log of what the publisher sends: which PUBLISHes are second sends."""
    global connects
    pub_m = re.match(r"Sending PUBLISH \(d(\d), q2, r0, m(\d+)\)", buf)
    rel_m = re.match(r"Sending PUBREL \(Mid: (\d+)\)", buf)
    with lock:
        if buf.startswith("Sending CONNECT"):
            connects += 1
        elif rel_m and sent.get(int(rel_m.group(1))) is not None:
            rel_sent.add(sent[int(rel_m.group(1))])
        elif pub_m and sent.get(int(pub_m.group(2))) is not None:
            p = sent[int(pub_m.group(2))]
            if p in rel_sent:
                again[p] = "PUBLISH after its PUBREL"
            elif pub_clean and first_sent.get(p, connects) < connects:
                again[p] = "resent after a clean reconnect"
            first_sent.setdefault(p, connects)


start()
sub = mqtt.Client(client_id="q2k-sub", clean_session=False, protocol=mqtt.MQTTv311)
sub.on_connect, sub.on_message = on_connect, on_message
sub.on_subscribe = lambda c, u, mid, granted: subscribed.set()
sub.reconnect_delay_set(0.05, 0.2)
sub.connect("127.0.0.1", port, keepalive=30)
sub.loop_start()
if not subscribed.wait(30):
    sys.exit("the subscriber got no SUBACK")

pub = mqtt.Client(client_id="q2k-pub", clean_session=pub_clean, protocol=mqtt.MQTTv311)
pub.on_publish, pub.on_log = on_publish, on_log
pub.reconnect_delay_set(0.05, 0.2)
pub.connect("127.0.0.1", port, keepalive=30)
pub.loop_start()
publishing = True
n_sent = 0


def publisher():
    global n_sent
    while publishing:
        with lock:
            pending = n_sent - len(completed)
        if pending >= 100:  # paho queues beyond its 20 in flight: keep that bounded
            time.sleep(0.002)
            continue
        payload = str(n_sent)
        # not under `lock`: on_publish takes it in paho's thread, which holds paho's locks
        info = pub.publish("q2/t", payload, qos=2)
        with lock:
            if info.mid in early:
                early.discard(info.mid)
                completed.add(payload)
            else:
                sent[info.mid] = payload
            n_sent += 1


random.seed(os.getpid())
t = threading.Thread(target=publisher)
t.start()
for k in range(kills):
    rnd = k
    time.sleep(0.2 + random.random() * 0.6)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    start()
    rnd = k + 1
publishing = False
t.join()
# the last round: every flow finishes, and a duplicate on its way arrives
end = time.time() + 30
while time.time() < end:
    with lock:
        settled = len(completed) == n_sent and all(str(i) in got for i in range(n_sent))
    if settled:
        break
    time.sleep(0.05)
time.sleep(0.5)
pub.loop_stop()
sub.loop_stop()
proc.send_signal(signal.SIGTERM)
try:
    rc = proc.wait(10)
except subprocess.TimeoutExpired:
    proc.kill()
    rc = "none in 10 s"

with lock:
    dups = {p: v for p, v in got.items() if len(v) > 1}
    lost = sorted((p for p in completed if p not in got), key=int)
    by_paho = {p for p in dups if p in again}
for p, v in sorted(dups.items(), key=lambda x: int(x[0])):
    print(f"duplicate {p}: " + ", ".join(f"id {m} dup {d} retain {r} round {k}"
                                        for m, d, r, k in v) +
          f"; paho: {again.get(p, 'sent it once')}")
for p in lost[:10]:
    print(f"lost {p} (completed for the publisher)")
print(f"{kills} kills, {'clean' if pub_clean else 'persistent'} publisher: {n_sent} published, "
      f"{len(completed)} completed, {len(got)} received, {len(dups)} delivered twice "
      f"({len(by_paho)} sent twice by paho, {len(dups) - len(by_paho)} not), {len(lost)} lost"
      f"{'' if settled else ', not settled'}; broker exit {rc}")
sys.exit(0 if len(dups) == len(by_paho) and not lost and settled and rc == 0 else 1)
