#!/bin/bash
# Runs "$@" with a host-memory and disk watchdog: every 2 s it logs MemAvailable; under 12 GiB it logs the largest
# processes and kills graphllm's (a host that runs out of memory stops answering and loses the call's output).
( while sleep 2; do
    a=$(awk '/MemAvailable/{print int($2/1048576)}' /proc/meminfo)
    d=$(df -BG --output=avail /tmp | tail -1 | tr -dc 0-9)
    echo "$(date +%T) avail ${a}G disk ${d}G $(ps -eo rss,comm --sort=-rss | sed -n 2p)" >> /tmp/mem.log
    if [ "$d" -lt 3 ]; then echo "LOW DISK: ${d}G" >> /tmp/mem.log; du -sh /tmp/* 2>/dev/null >> /tmp/mem.log; pkill -9 -f graphllm; fi
    if [ "$a" -lt 12 ]; then
      echo "LOW MEMORY: ${a}G" >> /tmp/mem.log; ps -eo pid,rss,args --sort=-rss | head -12 | cut -c1-200 >> /tmp/mem.log
      pkill -9 -f graphllm; pkill -9 -f pytest
    fi
  done ) &
watch=$!
"$@"; rc=$?
kill $watch
awk 'NR % 15 == 0 || /LOW|^ *[0-9]+ [0-9]+ /' /tmp/mem.log | tail -40
exit $rc
