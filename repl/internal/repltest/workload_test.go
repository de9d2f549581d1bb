package repltest

import (
	"testing"

	"github.com/lockd-dev/lockd/shard"
)

func TestWorkloadMix(t *testing.T) {
	recs := Workload(t, 100000, 1)
	kinds := map[shard.RecordKind]int{}
	for _, r := range recs {
		kinds[r.Kind]++
	}
	t.Logf("grant %d, release %d, expire %d, renew %d", kinds[shard.RecordGrant], kinds[shard.RecordRelease],
		kinds[shard.RecordExpire], kinds[shard.RecordRenew])
	for k := shard.RecordGrant; k <= shard.RecordRenew; k++ {
		if kinds[k] < 100 {
			t.Errorf("%v: %d records of %d", k, kinds[k], len(recs))
		}
	}
}
