# will_paho.py PORT - the will test with Python paho-mqtt (Debian python3-paho-mqtt), another
# client library than MQTT.js and mosquitto's: a 5.0 subscriber gets a will sent with a Will
# Delay Interval, then a later message. paho's network thread dies on a property that does not
# belong in a PUBLISH, so the later message shows whether the subscriber survived the will.
# Prints what the subscriber got and whether its thread still runs; exits 0 when both came.
# (Not named paho.py: the script's folder comes first in sys.path, and would shadow paho.)
import socket
import sys
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

port = int(sys.argv[1])
got = []


def until(cond, what):
    end = time.time() + 10
    while not cond():
        if time.time() > end:
            print(f"timed out waiting for {what}; got {got}")
            sys.exit(1)
        time.sleep(0.02)


subscribed = []
sub = mqtt.Client(client_id="paho-sub", protocol=mqtt.MQTTv5)
sub.on_message = lambda c, u, m: got.append(m.topic)
sub.on_subscribe = lambda c, u, mid, codes, props: subscribed.append(mid)
sub.connect("127.0.0.1", port)
sub.subscribe([("will/t", 1), ("later/t", 1)])
sub.loop_start()
until(lambda: subscribed, "SUBACK")

w = mqtt.Client(client_id="paho-will", protocol=mqtt.MQTTv5)
wp = Properties(PacketTypes.WILLMESSAGE)
wp.WillDelayInterval = 0
wp.ContentType = "text/plain"
w.will_set("will/t", "gone", qos=1, properties=wp)
w.connect("127.0.0.1", port)
while not w.is_connected():
    w.loop(0.05)
w.socket().shutdown(socket.SHUT_RDWR)  # gone without DISCONNECT: the will is published
until(lambda: "will/t" in got, "the will")

p = mqtt.Client(client_id="paho-pub", protocol=mqtt.MQTTv5)
p.connect("127.0.0.1", port)
p.loop_start()
p.publish("later/t", "x", qos=1).wait_for_publish()
until(lambda: "later/t" in got, "the message after the will")
alive = sub._thread is not None and sub._thread.is_alive()
print(got, "subscriber thread alive" if alive else "subscriber thread dead")
sys.exit(0 if alive else 1)
