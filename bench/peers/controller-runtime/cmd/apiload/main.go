// Command apiload is the benchmark's load generator and api-server ceiling: plain client-go
// (dynamic client, client-side rate limiter off) with no operator in the loop.
//
//	apiload create  -n N -namespaces a,b -prefix item -value V -concurrency C
//	    POST N BenchItems as fast as C goroutines can (the converge scenario's loader).
//	apiload ceiling -n N -namespaces a,b -prefix item -value V -concurrency C -mode converge|status
//	    converge: each object is created and then gets its status write (what an ideal
//	    operator with zero overhead would add), timed from the first create to the last write.
//	    status:   only the status writes, on objects that already exist (created, untimed).
//
// It prints one JSON object: timestamps are Unix seconds so the Python harness can line them
// up with its watch observer and the api-server's metrics.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
)

var gvr = schema.GroupVersionResource{Group: "bench.operator.local", Version: "v1", Resource: "benchitems"}

type result struct {
	Mode        string  `json:"mode"`
	Objects     int     `json:"objects"`
	Concurrency int     `json:"concurrency"`
	Start       float64 `json:"start"`
	FirstCreate float64 `json:"first_create,omitempty"`
	LastCreate  float64 `json:"last_create,omitempty"`
	End         float64 `json:"end"`
	Creates     int64   `json:"creates"`
	StatusOK    int64   `json:"status_writes"`
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func item(namespace, name string, value int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "bench.operator.local/v1",
		"kind":       "BenchItem",
		"metadata":   map[string]interface{}{"name": name, "namespace": namespace},
		"spec":       map[string]interface{}{"value": value},
	}}
}

func main() {
	var (
		n           = flag.Int("n", 100, "objects")
		namespaces  = flag.String("namespaces", "default", "comma-separated namespaces, filled round-robin")
		prefix      = flag.String("prefix", "item", "object name prefix")
		value       = flag.Int64("value", 1, "spec.value")
		concurrency = flag.Int("concurrency", 16, "goroutines")
		mode        = flag.String("mode", "converge", "ceiling mode: converge | status")
		kubeconfig  = flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig")
	)
	flag.Parse()
	if flag.NArg() != 1 || (flag.Arg(0) != "create" && flag.Arg(0) != "ceiling") {
		fmt.Fprintln(os.Stderr, "usage: apiload create|ceiling [flags]")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg.QPS, cfg.Burst = -1, 0 // no client-side limiter: measure the server
	client := dynamic.NewForConfigOrDie(cfg)
	nss := strings.Split(*namespaces, ",")
	ctx := context.Background()
	res := result{Mode: flag.Arg(0), Objects: *n, Concurrency: *concurrency}
	if res.Mode == "ceiling" {
		res.Mode = "ceiling-" + *mode
	}

	var errs atomic.Int64
	var firstErr sync.Once
	fail := func(err error) {
		errs.Add(1)
		firstErr.Do(func() { res.FirstError = err.Error() })
	}
	status := map[string]interface{}{"status": map[string]interface{}{"value": *value, "observedGeneration": int64(1)}}
	statusPatch, _ := json.Marshal(status)

	if res.Mode == "ceiling-status" { // untimed set-up: the objects exist before the clock starts
		run(*n, *concurrency, func(i int) {
			ns := nss[i%len(nss)]
			if _, err := client.Resource(gvr).Namespace(ns).Create(ctx, item(ns, fmt.Sprintf("%s-%d", *prefix, i), *value), metav1.CreateOptions{}); err != nil {
				fail(err)
			}
		})
	}

	var creates, writes atomic.Int64
	var mu sync.Mutex
	var first, last time.Time
	start := time.Now()
	run(*n, *concurrency, func(i int) {
		ns := nss[i%len(nss)]
		name := fmt.Sprintf("%s-%d", *prefix, i)
		rc := client.Resource(gvr).Namespace(ns)
		rv := ""
		if res.Mode != "ceiling-status" {
			t0 := time.Now()
			created, err := rc.Create(ctx, item(ns, name, *value), metav1.CreateOptions{})
			if err != nil {
				fail(err)
				return
			}
			creates.Add(1)
			rv = created.GetResourceVersion()
			mu.Lock()
			if first.IsZero() || t0.Before(first) {
				first = t0
			}
			if now := time.Now(); now.After(last) {
				last = now
			}
			mu.Unlock()
		}
		if res.Mode == "create" {
			return
		}
		body := statusPatch
		if rv != "" { // the same optimistic-lock patch the operators send
			withRV := map[string]interface{}{"metadata": map[string]interface{}{"resourceVersion": rv}, "status": status["status"]}
			body, _ = json.Marshal(withRV)
		}
		if _, err := rc.Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
			fail(err)
			return
		}
		writes.Add(1)
	})
	end := time.Now()
	res.Start, res.End = unix(start), unix(end)
	if !first.IsZero() {
		res.FirstCreate, res.LastCreate = unix(first), unix(last)
	}
	res.Creates, res.StatusOK, res.Errors = creates.Load(), writes.Load(), errs.Load()
	_ = json.NewEncoder(os.Stdout).Encode(res)
	if res.Errors > 0 {
		os.Exit(1)
	}
}

// run calls f(0..n-1) from c goroutines.
func run(n, c int, f func(int)) {
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}
