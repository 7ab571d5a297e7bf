% packets.pl - the one-million-packet exchange of bench/packets in SWI-Prolog, a baseline for
% bench/packets: 100 producer threads and 100 consumer threads share one message queue
% (SWI's default: blocking and unbounded); each sends or receives 10,000 packets [0].
% Prints "ns=T", T the median wall time of 3 runs of test/0.
%
%   swipl -g main -t halt packets.pl

execute(G, [size(N)]) :-
    length(T, N),
    maplist(thread_create(G), T),
    maplist(thread_join, T).

producer(C) :-
    execute(
        (between(1,100,_),
         between(1,100,_),
         thread_send_message(C,[0]),
         fail; true), [size(100)]
    ).

consumer(C) :-
    execute(
        (between(1,100,_),
         between(1,100,_),
         thread_get_message(C,[0]),
         fail; true), [size(100)]
    ).

% The producer thread is joined, so that runs can follow each other.
test :-
    message_queue_create(C),
    thread_create(producer(C), P),
    consumer(C),
    thread_join(P),
    message_queue_destroy(C).

timed(NS) :-
    get_time(T0),
    test,
    get_time(T1),
    NS is round((T1 - T0) * 1.0e9).

main :-
    findall(NS, (between(1, 3, _), timed(NS)), L),
    msort(L, [_, Median, _]),
    format("ns=~d~n", [Median]).
