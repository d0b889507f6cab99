package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/runtime"
)

// TestAMQPWithRabbitmqadmin: RabbitMQ's own command-line client, rabbitmqadmin (through the
// management plugin of a RabbitMQ node of the test's own: the machine's broker has it off),
// publishes two orders to the exchange the round trip's source reads, with a message_id and a
// header; they go through the source, a map and a filter stage and the sink to another queue,
// and rabbitmqadmin gets them from there: each once, with the routing key the sink gave it, the
// header, and a message_id of the sink's. The node and its management plugin take a minute or more
// to start on a loaded machine: the test runs with -soak (make soak-connectors).
func TestAMQPWithRabbitmqadmin(t *testing.T) {
	if !*soakFlag {
		t.Skip("a RabbitMQ node with its management plugin takes a minute to start: run with -soak (make soak-connectors)")
	}
	admin, err := exec.LookPath("rabbitmqadmin")
	if err != nil {
		if os.Getenv("FLOWRUN_REQUIRE_TOOLS") != "" {
			t.Fatalf("rabbitmqadmin (Debian's rabbitmq-server package): %v", err)
		}
		t.Skipf("rabbitmqadmin is not installed: %v", err)
	}
	node := startRabbitNodeWith(t, true)
	if node == nil {
		if os.Getenv("FLOWRUN_REQUIRE_TOOLS") != "" {
			t.Fatal("a RabbitMQ node of the test's own does not start here")
		}
		t.Skip("a RabbitMQ node of the test's own does not start here")
	}
	waitFor(t, "the management plugin to listen", func() bool {
		conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(node.mgmtPort))
		if err == nil {
			_ = conn.Close()
		}
		return err == nil
	})
	rabbitmqadmin := func(args ...string) []byte {
		t.Helper()
		args = append([]string{"-H", "127.0.0.1", "-P", strconv.Itoa(node.mgmtPort), "-u", "guest", "-p", "guest"}, args...)
		out, err := exec.Command(admin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("rabbitmqadmin %s: %v: %s", strings.Join(args[8:], " "), err, out)
		}
		return out
	}
	in, out := amqpName(t), amqpName(t)
	amqpQueue(t, node.url(), in, nil)
	amqpQueue(t, node.url(), out, nil)
	prefix := fmt.Sprintf("amqpadmin-%d", prefixes.Add(1))
	plan := buildSource(t, amqpRoundTrip(prefix, "effectively_once", node.url(), in, out))
	c := server.open(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log syncBuffer
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log)})
		ended <- err
	}()
	for i, region := range []string{"eu", "us"} {
		rabbitmqadmin("publish", "exchange="+in, "routing_key="+in+"."+region,
			fmt.Sprintf(`payload={"i":%d,"region":%q}`, i, region),
			fmt.Sprintf(`properties={"message_id":"order-%d","headers":{"origin":"shop"}}`, i))
	}
	waitFor(t, "both orders in the out queue", func() bool {
		select {
		case err := <-ended:
			t.Fatalf("the run ended: %v\n%s", err, log.String())
		default:
		}
		return amqpDepth(t, node.url(), out) == 2
	})
	stop()
	if err := <-ended; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	var got []struct {
		RoutingKey string `json:"routing_key"`
		Payload    string `json:"payload"`
		Properties struct {
			MessageID string            `json:"message_id"`
			Headers   map[string]string `json:"headers"`
		} `json:"properties"`
	}
	raw := rabbitmqadmin("-f", "raw_json", "get", "queue="+out, "count=10", "ackmode=ack_requeue_false")
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("rabbitmqadmin get: %v: %s", err, raw)
	}
	if len(got) != 2 {
		t.Fatalf("rabbitmqadmin got %d messages, want 2: %s", len(got), raw)
	}
	for _, m := range got {
		var v struct {
			I      int    `json:"i"`
			Region string `json:"region"`
			Via    string `json:"via"`
		}
		if err := json.Unmarshal([]byte(m.Payload), &v); err != nil {
			t.Fatalf("%v: %s", err, m.Payload)
		}
		i, region := v.I, []string{"eu", "us"}[v.I%2] // the two keys' partitions publish in either order
		if m.RoutingKey != out+".out."+region || v.I != i || v.Region != region || v.Via != "flowrun" || m.Properties.Headers["origin"] != "shop" ||
			!strings.HasPrefix(m.Properties.MessageID, "amqproundtrip/rabbit_out/") {
			t.Errorf("rabbitmqadmin got %+v; want order %d on %s.out.%s, through the map, with its header and a message_id of the sink's", m, i, out, region)
		}
	}
	t.Logf("rabbitmqadmin publish -> source -> map -> filter -> sink -> rabbitmqadmin get: %s", raw)
}
