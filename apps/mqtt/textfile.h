/*
 * textfile.h - opening the broker's text files (configuration, password and ACL files).
 *
 * Only a regular file is read. A FIFO or a device put in a file's place (by mistake or by
 * someone who may write the directory) would block the reader forever, or feed it without
 * end; password and ACL files are reloaded by the broker's signal task, which would then
 * ignore SIGTERM too. The open itself does not block (O_NONBLOCK until the type is known).
 * Nor is a file larger than TEXTFILE_MAX read: a sparse file of gigabytes without a newline
 * made one line of it in memory, and held SIGTERM for as long (an ACL of 10^6 users is 74 MB).
 */
#define TEXTFILE_MAX (256l << 20)
#ifndef MQTT_TEXTFILE_H
#define MQTT_TEXTFILE_H

#include <stddef.h>
#include <stdio.h>

/* path opened for reading, or NULL with "PATH: error: WHY" in err. */
FILE *textfile_open(const char *path, char *err, size_t errcap);

#endif
