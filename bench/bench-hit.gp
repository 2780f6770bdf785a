# bench/bench-hit.gp: bench/run-hit's CSV (case size median p10 p90) as bars per case,
# one cluster per size, log scale. gnuplot -e "csv='...'; out='...png'" bench/bench-hit.gp
set terminal pngcairo size 1100,600 noenhanced
set output out
set title "A repeated registration (bench/run-hit, one VM boot; medians, p10-p90 bars)"
set ylabel "microseconds per operation (log)"
set logscale y
set style data histograms
set style histogram errorbars gap 1 lw 1
set style fill solid 0.6 border -1
set key off
set xtics rotate by -30
set grid ytics
plot csv using 3:4:5:xtic(sprintf("%s %d", stringcolumn(1), $2)) lc rgb "#4477aa"
