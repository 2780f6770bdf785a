# bench/bench-rdma.gp: plot bench-rdma's CSV files (bench/run-rdma runs it on the host).
#   gnuplot -e "dir='build/bench-results'" bench/bench-rdma.gp   -> DIR/bench-rdma.png
# Left: RDMA WRITE latency (median and p99, µs) vs size, log-log, odpd keys vs own keys.
# Middle: throughput (MB/s, median of rounds) vs size. Right: the ratios odpd / own with the
# median and range of the per-round ratios; 1 = an MR is an MR. On rxe a WRITE is a software copy in the
# kernel: this compares the MRs, not hardware.
if (!exists("dir")) dir = "build/bench-results"
set terminal pngcairo size 1900,640 font ",10" noenhanced
set output dir."/bench-rdma.png"
set datafile separator ","
set datafile columnheaders
set datafile commentschars "#"
set multiplot layout 1,3 title "RDMA WRITE through odpd MRs vs own ibv_reg_mr MRs (daemon-PD mode), one qemu TCG + Soft-RoCE run: rxe copies in software, compare within the run only"

set logscale x
set xlabel "bytes per RDMA WRITE"
set xtics ("64" 64, "256" 256, "1K" 1024, "4K" 4096, "16K" 16384, "64K" 65536, "256K" 262144, "1M" 1048576, "4M" 4194304, "16M" 16777216)
set autoscale xfix
set offsets graph 0.08, graph 0.08, 0, 0
stats dir."/rdma.csv" using "window" nooutput
window = int(STATS_max)
set grid

set title "latency: one signalled WRITE, post to completion (log-log)"
set logscale y
set ylabel "µs"
set format y "%.0f"
set key top left
plot dir."/rdma.csv" using "size_bytes":"lat_median_odpd_us" with linespoints lw 2 pt 7 lc 1 title "median, odpd keys", \
     ''              using "size_bytes":"lat_median_own_us"  with linespoints lw 2 pt 6 lc 2 dt 2 title "median, own keys", \
     ''              using "size_bytes":"lat_p99_odpd_us"    with linespoints lw 1 pt 5 lc 1 title "p99, odpd keys", \
     ''              using "size_bytes":"lat_p99_own_us"     with linespoints lw 1 pt 4 lc 2 dt 2 title "p99, own keys"

set title sprintf("throughput: %d WRITEs outstanding (median of rounds)", window)
set ylabel "MB/s"
set format y "%g"
plot dir."/rdma.csv" using "size_bytes":"mbps_odpd" with linespoints lw 2 pt 7 lc 1 title "odpd keys", \
     ''              using "size_bytes":"mbps_own"  with linespoints lw 2 pt 6 lc 2 dt 2 title "own keys"

set title "odpd / own: median of the per-round ratios (bars: min..max)"
unset logscale y
set ylabel "ratio odpd / own"
set yrange [0:*]
set key top left
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead lw 1 dt 3 lc rgb "black"
plot dir."/rdma.csv" using (column("size_bytes")*0.93):"ratio_lat_rounds":"ratio_lat_rounds_min":"ratio_lat_rounds_max" \
                     with yerrorlines lw 2 pt 7 lc 1 title "latency median (>1: odpd slower)", \
     ''              using (column("size_bytes")*1.07):"ratio_mbps_rounds":"ratio_mbps_rounds_min":"ratio_mbps_rounds_max" \
                     with yerrorlines lw 2 pt 5 lc 3 title "throughput (<1: odpd slower)", \
     ''              using "size_bytes":"ratio_lat_p99" with points pt 4 ps 1.5 lc 4 title "latency p99, all rounds"
unset multiplot
