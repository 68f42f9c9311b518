// etcd, as its own release binary runs it: etcdmain.Main with the process's arguments.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
