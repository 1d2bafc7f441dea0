"""Load generation: request shapes (workloads, texts), open-loop arrivals, and the client that replays them."""
