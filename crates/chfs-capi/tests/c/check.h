/* Assertion helpers of the C test programs (test code may print). */
#ifndef CHFS_TEST_CHECK_H
#define CHFS_TEST_CHECK_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond) do { \
	if (!(cond)) { \
		fprintf(stderr, "%s:%d: CHECK failed: %s (errno %d %s)\n", \
			__FILE__, __LINE__, #cond, errno, strerror(errno)); \
		exit(1); \
	} \
} while (0)

/* `call` must fail with -1 and errno `e`. */
#define CHECK_ERR(call, e) do { \
	errno = 0; \
	long long r_ = (long long)(call); \
	if (r_ != -1 || errno != (e)) { \
		fprintf(stderr, "%s:%d: %s: expected -1/%s, got %lld/%d (%s)\n", \
			__FILE__, __LINE__, #call, #e, r_, errno, strerror(errno)); \
		exit(1); \
	} \
} while (0)

/* `call` must return `v`. */
#define CHECK_EQ(call, v) do { \
	long long r_ = (long long)(call); \
	if (r_ != (long long)(v)) { \
		fprintf(stderr, "%s:%d: %s: expected %lld, got %lld (errno %d %s)\n", \
			__FILE__, __LINE__, #call, (long long)(v), r_, errno, \
			strerror(errno)); \
		exit(1); \
	} \
} while (0)

static inline unsigned char
pat(long long off, int seed)
{
	return (unsigned char)((off * 131 + seed * 7 + (off >> 9)) & 0xff);
}

#endif
