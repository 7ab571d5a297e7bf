/* Every feature of the language, for the golden test (features_flow.[ch].golden). */
include features_types.flux;   // a second .flux file
include <stdint.h>;            // C headers for the types
include "flux_types.h";

exclusive Account (int id) => struct account *;
readwrite Table (const char * name, int shard) => struct table *;
pool Conn () => struct conn *;
free Config () => struct config *;
precedence Table < Account;

condition isEven (int a) => bool;
condition isLong (const char *s) => bool;

node Accept () => (int fd);
node Boot () => ();
node abstract Page (int fd) => (int fd);
node Read (int fd) => (int fd, const char *s);
node Work (int fd, const char *s, guard Account(fd) as acct, guard Table/read(s, fd) as tab,
	   guard Conn() as conn, guard Config() as cfg) => (int fd);
node detached Reply (int fd) => (int fd);
node abstract Route (int fd) => ();
node Log (int fd) => ();
node Audit (int fd) => ();
node Close (int fd) => ();
node Oops (int fd, const char *s, int err) => ();

source Accept -> Page -> Route;
initial Boot;
Page = Read -> Work -> Reply;
Route : [isEven] = Log & Audit;
Route : [*] = Close;
handle error Work -> Oops;
