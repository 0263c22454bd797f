// Command bench-cr-operator is the controller-runtime peer of the benchmark: the BenchItem
// reconcile (read spec.value, write status.value and status.observedGeneration through the
// status subresource) written the way a Kubebuilder operator would write it.
//
// Everything not set by a flag is controller-runtime v0.23's default, on purpose: the benchmark
// compares frameworks as users get them. The flags are the knobs the harness varies and
// documents (client QPS/burst, MaxConcurrentReconciles, the reconcile's artificial duration)
// plus where to write the trace of reconcile starts the harness reads.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

var benchItem = schema.GroupVersionKind{Group: "bench.operator.local", Version: "v1", Kind: "BenchItem"}

// tracer appends "<unix seconds> <namespace>/<name> <generation>" per reconcile start; the
// harness derives reconcile counts and event-to-start latency from it, as for every peer.
type tracer struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (t *tracer) record(start time.Time, req reconcile.Request, generation int64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	fmt.Fprintf(t.w, "%.6f %s/%s %d\n", float64(start.UnixNano())/1e9, req.Namespace, req.Name, generation)
	t.mu.Unlock()
}

func (t *tracer) flushEvery(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			t.flush()
			return
		case <-tick.C:
			t.flush()
		}
	}
}

func (t *tracer) flush() {
	t.mu.Lock()
	_ = t.w.Flush()
	t.mu.Unlock()
}

type reconciler struct {
	client.Client
	sleep time.Duration
	trace *tracer
}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	start := time.Now()
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(benchItem)
	if err := r.Get(ctx, req.NamespacedName, obj); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	r.trace.record(start, req, obj.GetGeneration())
	if r.sleep > 0 {
		time.Sleep(r.sleep)
	}
	value, _, _ := unstructured.NestedFieldNoCopy(obj.Object, "spec", "value")
	current, _, _ := unstructured.NestedFieldNoCopy(obj.Object, "status", "value")
	observed, _, _ := unstructured.NestedInt64(obj.Object, "status", "observedGeneration")
	if current == value && observed == obj.GetGeneration() {
		return reconcile.Result{}, nil
	}
	// A merge patch carrying the resourceVersion read: a write based on a stale cache copy gets
	// 409 and is retried, as in this project's ctx.patch_status.
	base := client.MergeFromWithOptions(obj.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if err := unstructured.SetNestedField(obj.Object, value, "status", "value"); err != nil {
		return reconcile.Result{}, err
	}
	if err := unstructured.SetNestedField(obj.Object, obj.GetGeneration(), "status", "observedGeneration"); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.Status().Patch(ctx, obj, base)
}

func main() {
	var (
		qps       = flag.Float64("qps", 0, "client QPS; 0 keeps controller-runtime's default (client-side limiter off, -1)")
		burst     = flag.Int("burst", 0, "client burst; 0 keeps the client-go default (10)")
		sleepMS   = flag.Int("sleep-ms", 0, "extra milliseconds each reconcile takes (burst scenario)")
		tracePath = flag.String("trace", "", "file to append reconcile starts to")
		workers   = flag.Int("max-concurrent-reconciles", 0, "the controller's MaxConcurrentReconciles; 0 keeps controller-runtime's default (1)")
	)
	flag.Parse()
	log.SetLogger(zap.New(zap.UseDevMode(false)))

	cfg := ctrl.GetConfigOrDie()
	if *qps != 0 {
		cfg.QPS = float32(*qps)
	}
	if *burst != 0 {
		cfg.Burst = *burst
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		// No metrics or health listeners: nothing scrapes them here, and ports could collide.
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// The client reads unstructured objects live from the api-server unless told to use
		// the informer cache; a typed Kubebuilder operator reads from the cache, so this one does
		// too ("read from the cache, write to the api-server", as every implementation here).
		Client: client.Options{Cache: &client.CacheOptions{Unstructured: true}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	var trace *tracer
	if *tracePath != "" {
		f, err := os.OpenFile(*tracePath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "trace:", err)
			os.Exit(1)
		}
		defer f.Close()
		trace = &tracer{w: bufio.NewWriterSize(f, 1<<16)}
		go trace.flushEvery(ctx, 100*time.Millisecond)
	}
	watched := &unstructured.Unstructured{}
	watched.SetGroupVersionKind(benchItem)
	err = ctrl.NewControllerManagedBy(mgr).
		For(watched, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("benchitem").
		WithOptions(controller.Options{MaxConcurrentReconciles: *workers}).
		Complete(&reconciler{Client: mgr.GetClient(), sleep: time.Duration(*sleepMS) * time.Millisecond, trace: trace})
	if err != nil {
		fmt.Fprintln(os.Stderr, "controller:", err)
		os.Exit(1)
	}
	fmt.Printf("starting qps=%v burst=%v max-concurrent-reconciles=%v\n", cfg.QPS, cfg.Burst, *workers)
	if err := mgr.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "manager stopped:", err)
		os.Exit(1)
	}
	if trace != nil {
		trace.flush()
	}
}
