package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcd has no semaphore: neither its concurrency package (Mutex, RWMutex
// in the recipes, Election) nor its API. The nearest equivalent is the
// semaphore built the way concurrency.Mutex is built, which the contended
// workload runs: each waiter puts a key of its own, "<name>/<lease id>",
// on its session's lease (a crashed client's key goes with its lease), and
// the keys' creation revisions order the waiters. Where Mutex lets the
// first key hold, this lets the first `limit` keys hold: a waiter with
// fewer than `limit` keys created before its own holds a permit; the
// others wait, FIFO. Acquire is one txn (put the key if it is not there,
// and count the prefix's keys); a waiter that must wait watches the
// prefix's deletions from that txn's revision on, with the deleted keys'
// previous values, and counts down the deletions of keys created before
// its own: no request per wake-up, and no deletion missed. Release is the
// key's deletion (Mutex's Unlock). The fencing token is the key's creation
// revision.
//
// The other recipe that comes to mind, `limit` slot keys each taken by a
// txn "create it if absent" (nested txns to try every slot in one round
// trip) and a watch for any slot's deletion to try again, is not FIFO
// and wakes every waiter for every release, as Redisson does on Redis;
// the ordered-keys one is what an etcd user who knows Mutex would write,
// and is fair like lockd's queue.

// semOp is op for the semaphore workload's actions.
func (r *etcdRun) semOp(ctx context.Context, es *etcdSlot, a *action) (ansKind, uint64, error) {
	prefix := string(a.key) + "/"
	mine := fmt.Sprintf("%s%x", prefix, es.sess.Lease())
	switch a.op {
	case opAcquire:
		return semAcquire(ctx, es, prefix, mine, int64(a.limit), time.Duration(a.wait)*time.Second)
	case opRelease:
		if _, err := es.cli.Delete(ctx, mine); err != nil {
			return ansError, 0, err
		}
		return ansReleased, 0, nil
	}
	return ansError, 0, fmt.Errorf("etcd semaphore: no request for op %d", a.op)
}

// semAcquire takes a permit of the semaphore prefix for the slot's key
// mine, waiting up to wait.
func semAcquire(ctx context.Context, es *etcdSlot, prefix, mine string, limit int64, wait time.Duration) (ansKind, uint64, error) {
	cli := es.cli
	count := clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(mine), "=", 0)).
		Then(clientv3.OpPut(mine, "", clientv3.WithLease(es.sess.Lease())), count).
		Else(clientv3.OpGet(mine)).
		Commit()
	if err != nil {
		return ansError, 0, err
	}
	rev, ahead := resp.Header.Revision, int64(0)
	if resp.Succeeded {
		// Every other key there was created before this one.
		ahead = resp.Responses[1].GetResponseRange().Count - 1
	} else {
		// The key was left by an earlier call (it is deleted when a wait
		// is spent; an error may leave it): keep its place in the queue.
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) != 1 {
			return ansError, 0, errors.New("etcd semaphore: the waiter's key vanished")
		}
		rev = kvs[0].CreateRevision
		g, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithMaxCreateRev(rev-1))
		if err != nil {
			return ansError, 0, err
		}
		ahead = g.Count
		resp.Header = g.Header
	}
	if ahead < limit {
		return ansGranted, uint64(rev), nil
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	wch := cli.Watch(clientv3.WithRequireLeader(wctx), prefix, clientv3.WithPrefix(),
		clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut(), clientv3.WithPrevKV())
	for wr := range wch {
		if err := wr.Err(); err != nil {
			break
		}
		for _, ev := range wr.Events {
			if ev.PrevKv != nil && ev.PrevKv.CreateRevision < rev {
				ahead--
			}
		}
		if ahead < limit {
			return ansGranted, uint64(rev), nil
		}
	}
	// The wait is spent (or the watch failed): leave the queue, as
	// Mutex.Lock does when its context ends.
	dctx, dcancel := context.WithTimeout(context.Background(), etcdRequestTimeout)
	defer dcancel()
	if _, err := cli.Delete(dctx, mine); err != nil {
		return ansError, 0, err
	}
	if ctx.Err() == nil && wctx.Err() != nil {
		return ansRefused, 0, wctx.Err() // the wait was spent
	}
	return ansError, 0, errors.New("etcd semaphore: the watch ended before the wait")
}
