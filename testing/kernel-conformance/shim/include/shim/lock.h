/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Spinlocks and mutexes as real locks: a test-and-set word plus the owning thread, so a recursive
 * acquisition (a deadlock in the kernel code's locking) is reported by shim_bug instead of hanging.
 */
#ifndef SHIM_LOCK_H
#define SHIM_LOCK_H

#include <shim/types.h>
#include <shim/runtime.h>

typedef struct {
	int locked;
	const void *owner;
} spinlock_t;

struct mutex {
	spinlock_t l;
};

/* A per-thread address (defined once, in shim.c): identifies the owner without any libc thread API. */
extern __thread char shim_thread_token;

static inline void spin_lock_init(spinlock_t *l)
{
	l->locked = 0;
	l->owner = NULL;
}

static inline void shim_lock_acquire(spinlock_t *l, const char *file, int line)
{
	if (__atomic_load_n(&l->owner, __ATOMIC_RELAXED) == &shim_thread_token)
		shim_fatal("lock acquired twice by one thread", file, line);
	while (__atomic_exchange_n(&l->locked, 1, __ATOMIC_ACQUIRE))
		shim_cpu_relax();
	__atomic_store_n(&l->owner, &shim_thread_token, __ATOMIC_RELAXED);
}

static inline void shim_lock_release(spinlock_t *l, const char *file, int line)
{
	if (__atomic_load_n(&l->owner, __ATOMIC_RELAXED) != &shim_thread_token)
		shim_fatal("lock released by a thread that does not hold it", file, line);
	__atomic_store_n(&l->owner, NULL, __ATOMIC_RELAXED);
	__atomic_store_n(&l->locked, 0, __ATOMIC_RELEASE);
}

#define spin_lock(l) shim_lock_acquire((l), __FILE__, __LINE__)
#define spin_unlock(l) shim_lock_release((l), __FILE__, __LINE__)
#define spin_lock_irqsave(l, flags) do { (flags) = 0; spin_lock(l); } while (0)
#define spin_unlock_irqrestore(l, flags) do { (void)(flags); spin_unlock(l); } while (0)
#define spin_lock_bh(l) spin_lock(l)
#define spin_unlock_bh(l) spin_unlock(l)

#define mutex_init(m) spin_lock_init(&(m)->l)
#define mutex_lock(m) shim_lock_acquire(&(m)->l, __FILE__, __LINE__)
#define mutex_unlock(m) shim_lock_release(&(m)->l, __FILE__, __LINE__)
#define mutex_destroy(m) do { (void)(m); } while (0)

#endif
