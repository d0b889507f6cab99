package redis

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/internal/redistest"
)

func TestParseURLsSplitsOnlyBetweenURLs(t *testing.T) {
	for in, want := range map[string][]string{
		// Commas in the user information belong to it.
		"redis://app:p,w@h:1":         {"redis://app:p,w@h:1"},
		"redis://app:,p,,w,@h:1/2":    {"redis://app:,p,,w,@h:1/2"},
		"rediss://:a,b:c@h:1":         {"rediss://:a,b:c@h:1"},
		"app:p,w@h:1":                 {"redis://app:p,w@h:1"},
		"redis://app:p,w@h:1,h2:2":    {"redis://app:p,w@h:1", "redis://h2:2"},
		"redis://app:p,w@h:1, h2:2 ,": {"redis://app:p,w@h:1", "redis://h2:2"},
		"redis://a:p,w@h:1,redis://b:q,v@h:2,h3:3": {
			"redis://a:p,w@h:1", "redis://b:q,v@h:2", "redis://h3:3",
		},
		// Lists of seeds.
		"h1:1,h2:2,h3:3":                        {"redis://h1:1", "redis://h2:2", "redis://h3:3"},
		"redis://h1:1,h2:2/0":                   {"redis://h1:1", "redis://h2:2/0"},
		"redis://h1:1/0,redis://app:pw@h2:2":    {"redis://h1:1/0", "redis://app:pw@h2:2"},
		"rediss://u:pw@h1:1, rediss://h2:2":     {"rediss://u:pw@h1:1", "rediss://h2:2"},
		"unix:///tmp/a.sock,unix:///tmp/b.sock": {"unix:///tmp/a.sock", "unix:///tmp/b.sock"},
		// A later bare seed with credentials needs its scheme: without it, everything up to
		// its '@' is taken for the first URL's password, which fails to log in but leaks nothing.
		"redis://h1:1,app:pw@h2:2": {"redis://h1:1,app:pw@h2:2"},
		"":                         nil,
		" , ,":                     nil,
	} {
		if got := ParseURLs(in); !reflect.DeepEqual(got, want) {
			t.Errorf("ParseURLs(%q) = %q, want %q", in, got, want)
		}
	}
}

// Passwords made of these tokens and the characters that URLs treat specially: no token may
// appear in an error or a description.
var secretTokens = []string{"Kq7", "Zx4", "Wv9", "Jm2"}

// encodePassword percent-encodes what a URL's password cannot hold as it is; ',' and ':' stay.
func encodePassword(pw string) string {
	return strings.NewReplacer("%", "%25", "@", "%40", "/", "%2F", " ", "%20", "?", "%3F", "#", "%23").Replace(pw)
}

var specialPasswords = []string{
	"Kq7,Zx4",
	"Kq7,,Zx4,Wv9",
	",Kq7,Zx4,",
	"Kq7@Zx4",
	"Kq7:Zx4:",
	"Kq7/Zx4",
	"Kq7%Zx4",
	"Kq7 Zx4",
	"Kq7,Zx4@Wv9:Jm2/ % ,",
	"Kq7,h2:2,Zx4@Wv9",
}

func checkNoSecret(t *testing.T, what, s string) {
	t.Helper()
	for _, tok := range secretTokens {
		if strings.Contains(s, tok) {
			t.Errorf("%s shows part of the password (%s): %s", what, tok, s)
		}
	}
}

func TestPasswordsWithSpecialCharactersNeverShow(t *testing.T) {
	ctx := context.Background()
	dead := closedAddr(t)
	for _, pw := range specialPasswords {
		good := "redis://app:" + encodePassword(pw) + "@" + dead + "/0"
		if got := ParseURLs(good); len(got) != 1 || got[0] != good {
			t.Errorf("ParseURLs(%q) = %q: split a password", good, got)
		}
		if got := ParseURLs(good + ",h2:2," + good); len(got) != 3 || got[0] != good || got[2] != good {
			t.Errorf("ParseURLs of a list with %q = %q", good, got)
		}
		checkNoSecret(t, "RedactURL", RedactURL(good))
		// Badly encoded forms: the password as it is, and with only some characters encoded.
		for _, u := range []string{
			good,
			"redis://app:" + pw + "@" + dead + "/0",
			"redis://app:" + strings.ReplaceAll(pw, "%", "%25") + "@" + dead,
			"rediss://:" + pw + "@" + dead,
			"app:" + pw + "@" + dead,
			"redis://" + dead + ",redis://app:" + pw + "@" + dead,
		} {
			for _, part := range ParseURLs(u) {
				checkNoSecret(t, "RedactURL("+part+")", RedactURL(part))
			}
			_, err := Open(ctx, Options{URLs: []string{u}})
			if err == nil {
				t.Fatalf("Open(%q) succeeded", u)
			}
			checkNoSecret(t, "Open's error", err.Error())
		}
		_, err := Open(ctx, Options{URLs: []string{good}})
		if err == nil || !strings.Contains(err.Error(), dead) || !strings.Contains(err.Error(), "app:xxxxx@") {
			t.Errorf("Open(%q): the error should name the address and the user: %v", good, err)
		}
	}
}

func TestRedactURLPrintsOnlyWhatItCanIdentify(t *testing.T) {
	for in, want := range map[string]string{
		"redis://app:Kq7@h:1/2":          "redis://app:xxxxx@h:1/2",
		"redis://app:Kq7,Zx4@h:1":        "redis://app:xxxxx@h:1",
		"redis://h:1/2?dial_timeout=3s":  "redis://h:1/2?dial_timeout=3s",
		"unix://app:Kq7@/tmp/redis.sock": "unix://app:xxxxx@/tmp/redis.sock",
		"redis://app:12/Kq7@h:1":         "redis://xxxxx@h:1",        // '/' in the password
		"redis://app:12?Kq7@h:1/3":       "redis://xxxxx@h:1/3",      // '?'
		"redis://app:12#Kq7@h:1":         "redis://xxxxx@h:1",        // '#'
		"redis://app:Kq7 Zx4@h:1/x":      "redis://xxxxx@h:1",        // a space, and a path that is no db
		"redis://app:Kq7%zz@h:1":         "redis://xxxxx@h:1",        // a bad escape
		"redis://app:Kq7@h ost:1":        "redis://xxxxx@<redacted>", // no host to trust
		"redis://app:Kq7":                "redis://<redacted>",       // a fragment of a split URL
		"redis://app:Kq7,Zx4":            "redis://<redacted>",       // no '@': a host or a password?
		"app:Kq7@h:1":                    "<redacted URL>",           // no "://"
		"Kq7":                            "<redacted URL>",
		"redis://[::1]:6379/0":           "redis://[::1]:6379/0",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A real server and a real cluster with an ACL user whose password has every special character.
func TestOpenWithSpecialPasswords(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	for i, pw := range specialPasswords {
		user := "app" + string(rune('a'+i))
		acl := []any{"ACL", "SETUSER", user, "on", ">" + pw, "~*", "+@all"}
		if err := srv.Client(t).Do(ctx, acl...).Err(); err != nil {
			t.Fatal(err)
		}
		for _, n := range cl.Nodes() {
			if err := n.Client(t).Do(ctx, acl...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		userinfo := user + ":" + encodePassword(pw) + "@"
		var seeds []string
		for _, a := range cl.Addrs() {
			seeds = append(seeds, "redis://"+userinfo+a)
		}
		for name, urls := range map[string]string{
			"server":             "redis://" + userinfo + srv.Addr() + "/0",
			"cluster seeds":      strings.Join(seeds, ","),
			"cluster bare seeds": seeds[0] + "," + strings.Join(cl.Addrs()[1:], ","),
		} {
			c, err := Open(ctx, Options{URLs: []string{urls}})
			if err != nil {
				checkNoSecret(t, "Open's error", err.Error())
				t.Fatalf("%s, password %q: %v", name, pw, err)
			}
			checkNoSecret(t, "String()", c.String())
			if !strings.Contains(c.String(), user+":xxxxx@") {
				t.Errorf("String() = %q", c.String())
			}
			k := testKeys(t)
			if err := c.EnsureGroup(ctx, k.Stream("pw", i), "g"); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			_ = c.Close()
			// The wrong password: refused, and the error shows neither.
			wrong := strings.ReplaceAll(urls, encodePassword(pw), encodePassword(pw)+"Wv9")
			if c, err := Open(ctx, Options{URLs: []string{wrong}}); err == nil {
				_ = c.Close()
				t.Fatalf("%s: a wrong password was accepted", name)
			} else {
				checkNoSecret(t, "Open's error", err.Error())
			}
		}
	}
}

func TestValidateURLs(t *testing.T) {
	for _, tc := range []struct {
		urls []string
		want []string // in the message; "" for a valid list
		not  []string // never in the message
	}{
		{[]string{"redis://127.0.0.1:6379/0"}, nil, nil},
		{[]string{"rediss://u:p@h:1"}, nil, nil},
		{[]string{"unix:///tmp/r.sock"}, nil, nil},
		{[]string{"redis://[::1]:6379"}, nil, nil},
		{[]string{"redis://h"}, nil, nil},
		{[]string{"redis://h1:1", "redis://h2:2"}, nil, nil},
		{[]string{"redis://127.0.0.1:notaport"}, []string{`port "notaport"`, "redis://127.0.0.1:notaport", "1 to 65535"}, nil},
		{[]string{"redis://localhost:70000"}, []string{`port "70000"`}, nil},
		{[]string{"redis://app:Kq7@127.0.0.1:x1"}, []string{`port "x1"`, "redis://xxxxx@127.0.0.1:x1"}, []string{"Kq7"}},
		// No '@': "app:Kq7" may be a user and password that lost their host.
		{[]string{"redis://app:Kq7"}, []string{"port is not a number", "USER:PASSWORD@HOST:PORT"}, []string{"Kq7"}},
		{[]string{"http://x:1"}, []string{`scheme "http"`, "redis://", "rediss://", "unix://"}, nil},
		{[]string{"HTTPS://app:Kq7@x:1"}, []string{`scheme "HTTPS"`}, []string{"Kq7"}},
		{[]string{"redis://h:1/x"}, []string{`invalid database number: "x"`}, nil},
		{[]string{"redis://h:1/0?bogus=1"}, []string{"bogus"}, nil},
		{[]string{"unix://"}, []string{"invalid URL unix://: no socket path: write unix:///path/to/redis.sock"}, nil},
		{[]string{"unix://app:Kq7@"}, []string{"no socket path"}, []string{"Kq7"}},
		{[]string{"redis://::1:6379"}, []string{"brackets"}, nil},
		{[]string{"redis://h:1/2", "redis://h:2"}, []string{"db 2"}, nil},
		{[]string{"redis://h:1", "rediss://h:2"}, []string{"mix redis:// and rediss://"}, nil},
		{nil, []string{"no URL"}, nil},
	} {
		err := ValidateURLs(tc.urls)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("ValidateURLs(%q): %v", tc.urls, err)
			}
			continue
		}
		var uerr *URLError
		if !errors.As(err, &uerr) {
			t.Errorf("ValidateURLs(%q) = %v, want a *URLError", tc.urls, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ValidateURLs(%q) = %v: lacks %q", tc.urls, err, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(err.Error(), n) {
				t.Errorf("ValidateURLs(%q) = %v: shows %q", tc.urls, err, n)
			}
		}
		// Open finds the same before dialling anything.
		if _, oerr := Open(context.Background(), Options{URLs: tc.urls}); !errors.As(oerr, &uerr) || oerr.Error() != err.Error() {
			t.Errorf("Open(%q) = %v, want %v", tc.urls, oerr, err)
		}
	}
}
