// Command kfake runs franz-go's in-process Kafka (github.com/twmb/franz-go/pkg/kfake) as a process
// of its own on the loopback interface, for the kafka kinds' tests and benchmarks: there is no
// Kafka broker on the machines flowrun is developed and tested on. It is a module of its own
// because kfake needs a newer Go than the main module declares (go.mod); the tests build it with
// go build -C tools/kfake.
//
//	kfake -port 39092 -data DIR -topic in:4 -topic out:4 -config message.max.bytes=4096
//
// It prints "kfake listening on ADDR" once it takes connections, and closes the cluster cleanly
// on SIGTERM or SIGINT. With -data its topics, consumer groups' offsets and idempotent producers'
// state are kept in DIR, so a kfake started again on the same directory is the same broker
// restarted; a SIGKILL loses at most what the operating system had not yet been handed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	port := flag.Int("port", 0, "the loopback port to listen on; 0 picks a free one")
	data := flag.String("data", "", "the directory that keeps the cluster's state across restarts; none: in memory")
	auto := flag.Bool("auto-create", false, "create topics that producers name (Kafka's auto.create.topics.enable)")
	var topics, configs list
	flag.Var(&topics, "topic", "NAME:PARTITIONS, a topic to create at the start (repeatable)")
	flag.Var(&configs, "config", "KEY=VALUE, a broker configuration (repeatable), such as message.max.bytes=4096")
	flag.Parse()

	opts := []kfake.Opt{kfake.Ports(*port), kfake.NumBrokers(1)}
	for _, t := range topics {
		name, n, _ := strings.Cut(t, ":")
		parts, err := strconv.Atoi(n)
		if err != nil {
			fail("-topic %q: write NAME:PARTITIONS", t)
		}
		opts = append(opts, kfake.SeedTopics(int32(parts), name))
	}
	if len(configs) > 0 {
		m := map[string]string{}
		for _, c := range configs {
			k, v, ok := strings.Cut(c, "=")
			if !ok {
				fail("-config %q: write KEY=VALUE", c)
			}
			m[k] = v
		}
		opts = append(opts, kfake.BrokerConfigs(m))
	}
	if *auto {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	if *data != "" {
		opts = append(opts, kfake.DataDir(*data))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fail("%v", err)
	}
	fmt.Printf("kfake listening on %s\n", c.ListenAddrs()[0])
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	<-sigs
	c.Close()
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kfake: "+format+"\n", args...)
	os.Exit(2)
}
