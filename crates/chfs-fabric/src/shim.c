/*
 * The calls of libfabric chfs-fabric uses, as plain functions.
 *
 * Most of libfabric's API (fi_endpoint, fi_send, fi_cq_read, fi_mr_reg, ...)
 * is static inline functions in its headers that call through the ops
 * tables of each object, so Rust cannot link to them; this file compiles
 * them into real symbols, and puts the fixed set-up sequence (getinfo,
 * fabric, domain, completion queue, address vector, endpoint) and the
 * wait-then-read of the completion queue into one call each. Every
 * function returns 0 or a count on success and a negative libfabric error
 * (-FI_E*, the negated errno for most) on failure. src/ffi.rs declares
 * these for Rust; nothing else calls them.
 */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/*
 * libfabric itself is loaded on first use (dlopen), not linked: Debian's
 * build pulls in libpsm_infinipath, whose constructor installs handlers of
 * SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT that print a
 * backtrace and exit(1) -- in every process linked with it (chfsd exited 1
 * on SIGTERM; an application using libchfs would have had its signals
 * taken). Loaded here, only processes that open an endpoint load it, and
 * the handlers in place before the load are put back after it. Only these
 * few calls are real symbols; the rest of the API is inline functions
 * calling through the objects' ops tables.
 */
static struct {
	int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
		       struct fi_info **);
	void (*freeinfo)(struct fi_info *);
	struct fi_info *(*dupinfo)(const struct fi_info *);
	int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
	const char *(*strerror)(int);
	uint32_t (*version)(void);
} lf;
static pthread_once_t lf_once = PTHREAD_ONCE_INIT;
static int lf_loaded;

#ifndef CHFS_LIBFABRIC_PATH
#define CHFS_LIBFABRIC_PATH "libfabric.so.1"
#endif

/* Most places of the peer's memory one chfs_fi_writev names. */
#define CHFS_RMA_IOV_MAX 16

static void lf_load(void)
{
	static const int sigs[] = { SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL, SIGABRT };
	struct sigaction old[sizeof(sigs) / sizeof(sigs[0])];
	unsigned i;
	void *h;

	for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], NULL, &old[i]);
	h = dlopen(CHFS_LIBFABRIC_PATH, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
	for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &old[i], NULL);
	if (!h)
		return;
	*(void **)&lf.getinfo = dlsym(h, "fi_getinfo");
	*(void **)&lf.freeinfo = dlsym(h, "fi_freeinfo");
	*(void **)&lf.dupinfo = dlsym(h, "fi_dupinfo");
	*(void **)&lf.fabric = dlsym(h, "fi_fabric");
	*(void **)&lf.strerror = dlsym(h, "fi_strerror");
	*(void **)&lf.version = dlsym(h, "fi_version");
	lf_loaded = lf.getinfo && lf.freeinfo && lf.dupinfo && lf.fabric && lf.strerror &&
		    lf.version;
}

/* Loads libfabric once; 0 if it could not be (-FI_ENOSYS from the calls). */
static int lf_ready(void)
{
	pthread_once(&lf_once, lf_load);
	return lf_loaded;
}

struct chfs_fi_domain {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
};

/* What the Rust side needs to know of the domain it got. */
struct chfs_fi_domain_attr {
	uint64_t mr_mode;
	uint64_t inject_size;
	uint64_t max_msg_size;
	uint64_t iov_limit;
	uint64_t rma_iov_limit;
	uint32_t addr_format;
	char prov_name[64];
	char fabric_name[128];
	char domain_name[64];
};

/* How an endpoint's completion queue is waited on. */
enum { CHFS_WAIT_FD = 1, CHFS_WAIT_NONE = 3 };

struct chfs_fi_ep {
	struct chfs_fi_domain *d;
	struct fid_ep *ep;
	struct fid_av *av;
	struct fid_cq *cq;
	int wait;
	int fd;
};

/* One completion: the context the operation was posted with, its flags
 * (FI_SEND, FI_RECV, FI_READ, FI_WRITE...), the bytes received, the source
 * address where the provider knows it, and for a failed operation its
 * error (positive FI_E* / errno) and the provider's own code. */
struct chfs_fi_comp {
	uint64_t ctx;
	uint64_t flags;
	uint64_t len;
	uint64_t src;
	int32_t err;
	int32_t prov_errno;
};

struct chfs_fi_mr {
	struct fid_mr *mr;
	void *desc;
	uint64_t key;
};

static void copy_name(char *dst, size_t cap, const char *src)
{
	if (!src)
		src = "";
	strncpy(dst, src, cap - 1);
	dst[cap - 1] = 0;
}

const char *chfs_fi_strerror(int err)
{
	if (!lf_ready())
		return "libfabric could not be loaded";
	return lf.strerror(err < 0 ? -err : err);
}

uint32_t chfs_fi_version(void)
{
	return lf_ready() ? lf.version() : 0;
}

void chfs_fi_domain_close(struct chfs_fi_domain *d)
{
	if (!d)
		return;
	if (d->domain)
		fi_close(&d->domain->fid);
	if (d->fabric)
		fi_close(&d->fabric->fid);
	if (d->info)
		lf.freeinfo(d->info);
	free(d);
}

/*
 * Opens the fabric and domain of the first provider matching `prov`
 * (a provider name as fi_info prints it: "tcp;ofi_rxm", "shm", "verbs;ofi_rxm")
 * for reliable datagram endpoints with messages and RMA. `node`/`service`
 * (either may be NULL) name the local address to bind (FI_SOURCE).
 */
int chfs_fi_domain_open(const char *prov, const char *node, const char *service,
			struct chfs_fi_domain **out, struct chfs_fi_domain_attr *attr)
{
	struct fi_info *hints;
	struct chfs_fi_domain *d;
	int ret;

	*out = NULL;
	if (!lf_ready())
		return -FI_ENOSYS;
	hints = lf.dupinfo(NULL);
	if (!hints)
		return -FI_ENOMEM;
	hints->caps = FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_READ | FI_WRITE |
		      FI_REMOTE_READ | FI_REMOTE_WRITE;
	hints->mode = 0; /* operation contexts are opaque numbers, never FI_CONTEXT */
	hints->ep_attr->type = FI_EP_RDM;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY;
	hints->fabric_attr->prov_name = strdup(prov);
	if (!hints->fabric_attr->prov_name) {
		lf.freeinfo(hints);
		return -FI_ENOMEM;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		lf.freeinfo(hints);
		return -FI_ENOMEM;
	}
	ret = lf.getinfo(FI_VERSION(1, 9), node, service, (node || service) ? FI_SOURCE : 0,
			 hints, &d->info);
	lf.freeinfo(hints);
	if (ret)
		goto fail;
	ret = lf.fabric(d->info->fabric_attr, &d->fabric, NULL);
	if (ret)
		goto fail;
	ret = fi_domain(d->fabric, d->info, &d->domain, NULL);
	if (ret)
		goto fail;
	attr->mr_mode = (uint64_t)d->info->domain_attr->mr_mode;
	attr->inject_size = d->info->tx_attr->inject_size;
	attr->max_msg_size = d->info->ep_attr->max_msg_size;
	attr->iov_limit = d->info->tx_attr->iov_limit;
	attr->rma_iov_limit = d->info->tx_attr->rma_iov_limit;
	attr->addr_format = d->info->addr_format;
	copy_name(attr->prov_name, sizeof(attr->prov_name), d->info->fabric_attr->prov_name);
	copy_name(attr->fabric_name, sizeof(attr->fabric_name), d->info->fabric_attr->name);
	copy_name(attr->domain_name, sizeof(attr->domain_name), d->info->domain_attr->name);
	*out = d;
	return 0;
fail:
	chfs_fi_domain_close(d);
	return ret;
}

void chfs_fi_ep_close(struct chfs_fi_ep *e)
{
	if (!e)
		return;
	/* The endpoint first: closing it ends its outstanding operations, so
	 * the provider touches none of their buffers afterwards. */
	if (e->ep)
		fi_close(&e->ep->fid);
	if (e->av)
		fi_close(&e->av->fid);
	if (e->cq)
		fi_close(&e->cq->fid);
	free(e);
}

static int open_cq(struct chfs_fi_ep *e, size_t cq_size, enum fi_wait_obj wait)
{
	struct fi_cq_attr cq_attr;

	memset(&cq_attr, 0, sizeof(cq_attr));
	cq_attr.size = cq_size;
	cq_attr.format = FI_CQ_FORMAT_MSG;
	cq_attr.wait_obj = wait;
	cq_attr.wait_cond = FI_CQ_COND_NONE;
	return fi_cq_open(e->d->domain, &cq_attr, &e->cq, NULL);
}

/*
 * Opens an enabled endpoint on the domain with its own address vector and
 * one completion queue for sends and receives. The queue is opened with a
 * file descriptor to wait on (FI_WAIT_FD) where the provider has one, else
 * without a wait object; *wait_kind says which (CHFS_WAIT_*).
 */
int chfs_fi_ep_open(struct chfs_fi_domain *d, size_t cq_size, struct chfs_fi_ep **out,
		    int *wait_kind)
{
	struct fi_av_attr av_attr;
	struct chfs_fi_ep *e;
	int ret;

	*out = NULL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -FI_ENOMEM;
	e->d = d;
	e->fd = -1;
	ret = open_cq(e, cq_size, FI_WAIT_FD);
	if (ret == 0) {
		ret = fi_control(&e->cq->fid, FI_GETWAIT, &e->fd);
		if (ret == 0) {
			e->wait = CHFS_WAIT_FD;
		} else {
			fi_close(&e->cq->fid);
			e->cq = NULL;
		}
	}
	/* Not FI_WAIT_UNSPEC: some providers (shm in 1.17) implement it by
	 * calling sched_yield in a loop, a core busy while idle. Without a
	 * descriptor the caller sleeps between reads instead. */
	if (!e->cq) {
		ret = open_cq(e, cq_size, FI_WAIT_NONE);
		if (ret)
			goto fail;
		e->wait = CHFS_WAIT_NONE;
	}
	memset(&av_attr, 0, sizeof(av_attr));
	/* Indices, not provider pointers: an fi_addr_t is a number the Rust
	 * side checks against the peers it inserted. */
	av_attr.type = FI_AV_TABLE;
	ret = fi_av_open(d->domain, &av_attr, &e->av, NULL);
	if (ret)
		goto fail;
	ret = fi_endpoint(d->domain, d->info, &e->ep, NULL);
	if (ret)
		goto fail;
	ret = fi_ep_bind(e->ep, &e->av->fid, 0);
	if (ret)
		goto fail;
	ret = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV);
	if (ret)
		goto fail;
	ret = fi_enable(e->ep);
	if (ret)
		goto fail;
	*wait_kind = e->wait;
	*out = e;
	return 0;
fail:
	chfs_fi_ep_close(e);
	return ret;
}

int chfs_fi_getname(struct chfs_fi_ep *e, void *buf, size_t *len)
{
	return fi_getname(&e->ep->fid, buf, len);
}

int chfs_fi_av_insert(struct chfs_fi_ep *e, const void *addr, uint64_t *fi_addr)
{
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	int ret = fi_av_insert(e->av, addr, 1, &a, 0, NULL);

	if (ret == 1) {
		*fi_addr = a;
		return 0;
	}
	return ret < 0 ? ret : -FI_EINVAL;
}

int chfs_fi_av_remove(struct chfs_fi_ep *e, uint64_t fi_addr)
{
	fi_addr_t a = fi_addr;

	return fi_av_remove(e->av, &a, 1, 0);
}

ssize_t chfs_fi_send(struct chfs_fi_ep *e, const void *buf, size_t len, void *desc,
		     uint64_t dest, uint64_t ctx)
{
	return fi_send(e->ep, buf, len, desc, dest, (void *)(uintptr_t)ctx);
}

ssize_t chfs_fi_inject(struct chfs_fi_ep *e, const void *buf, size_t len, uint64_t dest)
{
	return fi_inject(e->ep, buf, len, dest);
}

ssize_t chfs_fi_recv(struct chfs_fi_ep *e, void *buf, size_t len, void *desc, uint64_t ctx)
{
	return fi_recv(e->ep, buf, len, desc, FI_ADDR_UNSPEC, (void *)(uintptr_t)ctx);
}

ssize_t chfs_fi_read(struct chfs_fi_ep *e, void *buf, size_t len, void *desc, uint64_t src,
		     uint64_t raddr, uint64_t key, uint64_t ctx)
{
	return fi_read(e->ep, buf, len, desc, src, raddr, key, (void *)(uintptr_t)ctx);
}

ssize_t chfs_fi_write(struct chfs_fi_ep *e, const void *buf, size_t len, void *desc,
		      uint64_t dest, uint64_t raddr, uint64_t key, uint64_t ctx)
{
	return fi_write(e->ep, buf, len, desc, dest, raddr, key, (void *)(uintptr_t)ctx);
}

/* An RMA write gathered from `count` local pieces and scattered into
 * `rma_count` places of the peer's memory under one key (at most the
 * domain's iov_limit and rma_iov_limit), with the completion semantics of
 * a plain fi_write (the endpoint's default operation flags). */
ssize_t chfs_fi_writev(struct chfs_fi_ep *e, const struct iovec *iov, void **desc, size_t count,
		       uint64_t dest, const uint64_t *raddr, const uint64_t *rlen,
		       size_t rma_count, uint64_t key, uint64_t ctx)
{
	struct fi_rma_iov rma[CHFS_RMA_IOV_MAX];
	struct fi_msg_rma msg;
	size_t i;

	if (rma_count > CHFS_RMA_IOV_MAX)
		return -FI_EINVAL;
	for (i = 0; i < rma_count; i++) {
		rma[i].addr = raddr[i];
		rma[i].len = rlen[i];
		rma[i].key = key;
	}
	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = iov;
	msg.desc = desc;
	msg.iov_count = count;
	msg.addr = dest;
	msg.rma_iov = rma;
	msg.rma_iov_count = rma_count;
	msg.context = (void *)(uintptr_t)ctx;
	return fi_writemsg(e->ep, &msg, e->d->info->tx_attr->op_flags | FI_COMPLETION);
}

int chfs_fi_mr_reg(struct chfs_fi_domain *d, const void *buf, size_t len, uint64_t access,
		   uint64_t requested_key, struct chfs_fi_mr *out)
{
	int ret = fi_mr_reg(d->domain, buf, len, access, 0, requested_key, 0, &out->mr, NULL);

	if (ret)
		return ret;
	out->desc = fi_mr_desc(out->mr);
	out->key = fi_mr_key(out->mr);
	return 0;
}

void chfs_fi_mr_close(struct fid_mr *mr)
{
	if (mr)
		fi_close(&mr->fid);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static ssize_t take(struct fi_cq_msg_entry *ent, fi_addr_t *src, ssize_t n,
		    struct chfs_fi_comp *out)
{
	for (ssize_t i = 0; i < n; i++) {
		out[i].ctx = (uint64_t)(uintptr_t)ent[i].op_context;
		out[i].flags = ent[i].flags;
		out[i].len = ent[i].len;
		out[i].src = src[i];
		out[i].err = 0;
		out[i].prov_errno = 0;
	}
	return n;
}

static ssize_t take_err(struct chfs_fi_ep *e, struct chfs_fi_comp *out)
{
	struct fi_cq_err_entry err;
	ssize_t r;

	memset(&err, 0, sizeof(err));
	r = fi_cq_readerr(e->cq, &err, 0);
	if (r < 0)
		return r == -FI_EAGAIN ? 0 : r;
	out->ctx = (uint64_t)(uintptr_t)err.op_context;
	out->flags = err.flags;
	out->len = err.len;
	out->src = FI_ADDR_NOTAVAIL;
	out->err = err.err ? err.err : FI_EOTHER;
	out->prov_errno = err.prov_errno;
	return 1;
}

/*
 * Reads up to `max` completions (at most 64), driving the provider's
 * progress. With none ready it waits up to `timeout_ms` without spinning:
 * on the queue's file descriptor (after fi_trywait says nothing is left to
 * progress). Returns the number read,
 * 0 when the time ran out, or a negative error. A queue without a wait
 * object returns 0 at once; the caller sleeps.
 */
ssize_t chfs_fi_poll(struct chfs_fi_ep *e, struct chfs_fi_comp *out, size_t max, int timeout_ms)
{
	struct fi_cq_msg_entry ent[64];
	fi_addr_t src[64];
	int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	ssize_t n;

	if (max > 64)
		max = 64;
	if (max == 0)
		return 0;
	for (;;) {
		int left = (int)(deadline - now_ms());

		if (left < 0)
			left = 0;
		n = fi_cq_readfrom(e->cq, ent, max, src);
		if (n > 0)
			return take(ent, src, n, out);
		if (n == -FI_EAVAIL)
			return take_err(e, out);
		if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT)
			return n;
		if (left == 0 || e->wait == CHFS_WAIT_NONE)
			return 0;
		{
			struct fid *f = &e->cq->fid;
			struct pollfd p;
			int r = fi_trywait(e->d->fabric, &f, 1);

			if (r == -FI_EAGAIN)
				continue; /* events to progress: read again */
			if (r)
				return r;
			p.fd = e->fd;
			p.events = POLLIN;
			p.revents = 0;
			r = poll(&p, 1, left);
			if (r < 0 && errno != EINTR)
				return -errno;
		}
	}
}
