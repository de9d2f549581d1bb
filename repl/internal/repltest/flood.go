package repltest

import (
	"net"
	"sync"
	"time"
)

// Flood keeps up to open connections to addr that never say a word,
// replacing the oldest with a new one every few milliseconds, until stop
// is called; stop (once or more) closes them all and reports how many
// were opened.
func Flood(addr string, open int) (stop func() int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var n int
	wg.Add(1)
	go func() {
		defer wg.Done()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			select {
			case <-done:
				return
			default:
			}
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				n++
				conns = append(conns, c)
				if len(conns) > open {
					conns[0].Close()
					conns = conns[1:]
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	var once sync.Once
	return func() int {
		once.Do(func() { close(done) })
		wg.Wait()
		return n
	}
}
