// chfs.h is usable from C++ (extern "C" linkage): built with
// c++ $(pkg-config --cflags --libs chfs) by tests/capi.rs.
#include <sys/stat.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chfs.h>

static int
count(void *buf, const char *, const struct stat *, off_t)
{
	++*static_cast<int *>(buf);
	return 0;
}

int
main()
{
	int n = 0;

	if (chfs_version() == nullptr || std::strlen(chfs_version()) == 0)
		return 1;
	// Not initialised: must fail with ENOTCONN, not crash.
	if (chfs_readdir("/", &n, count) != -1 || errno != ENOTCONN)
		return 2;
	std::puts("cxx_header: ok");
	return 0;
}
